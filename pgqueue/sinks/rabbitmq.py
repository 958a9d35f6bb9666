"""The relay's `RabbitMQ` sink. It lives in `pgqueue.relay.sinks.rabbitmq`; this path stays
for applications that import it here, as the documentation shows."""

from pgqueue.relay.sinks.rabbitmq import RabbitMQ

__all__ = ["RabbitMQ"]
