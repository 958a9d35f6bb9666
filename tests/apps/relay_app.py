"""The Relay that tests/integration/test_relay*.py run as `pgqueue relay` processes. RELAY_SINKS
names the sinks it opens (default "redis,file"), so a test needs only its own broker:
- redis: Redis Streams at REDIS_URL;
- file: appends each message to the file RELAY_FILE (one JSON line each), so a test sees
  exactly what was handed over and in what order;
- rabbitmq: RabbitMQ at RABBIT_URL;
- nats: NATS JetStream at NATS_URL;
- celery: Celery task calls through its Redis broker CELERY_TEST_BROKER, on the queue
  CELERY_TEST_QUEUE."""

from __future__ import annotations

import json
import os
from datetime import timedelta

from pgqueue.relay import Relay
from pgqueue.sinks import CallableSink, Outgoing, Sink


def _append(message: Outgoing) -> None:
    line = {"id": message.message_id, "key": message.key, "message": message.message}
    with open(os.environ["RELAY_FILE"], "a") as out:
        out.write(json.dumps(line) + "\n")
        out.flush()
        os.fsync(out.fileno())


def _sink(name: str) -> Sink:
    if name == "file":
        return CallableSink(_append)
    if name == "redis":
        from pgqueue.sinks.redis import RedisStreams

        return RedisStreams(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    if name == "rabbitmq":
        from pgqueue.sinks.rabbitmq import RabbitMQ

        return RabbitMQ(os.environ.get("RABBIT_URL", "amqp://guest:guest@127.0.0.1:5672/"))
    if name == "nats":
        from pgqueue.sinks.nats import NatsJetStream

        return NatsJetStream(os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    if name == "celery":
        from celery import Celery

        from pgqueue.sinks.celery import CelerySink

        app = Celery("pgqueue_relay_test", broker=os.environ["CELERY_TEST_BROKER"])
        app.conf.update(
            task_default_queue=os.environ["CELERY_TEST_QUEUE"],
            broker_connection_retry_on_startup=True,
        )
        return CelerySink(app)
    raise ValueError(f"tests/relay_app.py has no sink {name!r}")


relay = Relay(
    {name: _sink(name) for name in os.environ.get("RELAY_SINKS", "redis,file").split(",")},
    batch_size=int(os.environ.get("RELAY_BATCH", "100")),
    poll_interval=timedelta(milliseconds=200),
    standby_interval=timedelta(milliseconds=200),
    report_interval=timedelta(milliseconds=200),
)
