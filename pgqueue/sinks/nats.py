"""The relay's `NatsJetStream` sink. It lives in `pgqueue.relay.sinks.nats`; this path stays
for applications that import it here, as the documentation shows."""

from pgqueue.relay.sinks.nats import NatsJetStream

__all__ = ["NatsJetStream"]
