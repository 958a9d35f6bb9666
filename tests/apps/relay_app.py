"""The Relay that tests/integration/test_relay.py runs as `pgqueue relay` processes: Redis
Streams at REDIS_URL, and a sink that appends each message to the file RELAY_FILE (one JSON
line each), so a test sees exactly what was handed over and in what order."""

from __future__ import annotations

import json
import os
from datetime import timedelta

from pgqueue.relay import Relay
from pgqueue.sinks import CallableSink, Outgoing
from pgqueue.sinks.redis import RedisStreams


def _append(message: Outgoing) -> None:
    line = {"id": message.message_id, "key": message.key, "message": message.message}
    with open(os.environ["RELAY_FILE"], "a") as out:
        out.write(json.dumps(line) + "\n")
        out.flush()
        os.fsync(out.fileno())


relay = Relay(
    {
        "redis": RedisStreams(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")),
        "file": CallableSink(_append),
    },
    batch_size=int(os.environ.get("RELAY_BATCH", "100")),
    poll_interval=timedelta(milliseconds=200),
    standby_interval=timedelta(milliseconds=200),
    report_interval=timedelta(milliseconds=200),
)
