"""The relay's `CelerySink` sink. It lives in `pgqueue.relay.sinks.celery`; this path stays
for applications that import it here, as the documentation shows."""

from pgqueue.relay.sinks.celery import CelerySink

__all__ = ["CelerySink"]
