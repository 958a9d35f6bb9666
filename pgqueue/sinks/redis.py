"""The relay's `RedisStreams` sink. It lives in `pgqueue.relay.sinks.redis`; this path stays
for applications that import it here, as the documentation shows."""

from pgqueue.relay.sinks.redis import RedisStreams

__all__ = ["RedisStreams"]
