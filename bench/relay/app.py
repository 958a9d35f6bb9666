"""The Relay that bench/relay/chaos.py runs as `pgqueue relay` processes: Redis Streams on
the bench's own redis-server (RELAY_REDIS_URL)."""

from __future__ import annotations

import os
from datetime import timedelta

from pgqueue.relay import Relay
from pgqueue.sinks.redis import RedisStreams

relay = Relay(
    {"redis": RedisStreams(os.environ["RELAY_REDIS_URL"])},
    batch_size=int(os.environ.get("RELAY_BATCH", "200")),
    poll_interval=timedelta(milliseconds=200),
    standby_interval=timedelta(milliseconds=200),
    retry_base=timedelta(milliseconds=100),
    retry_cap=timedelta(seconds=2),
)
