"""LISTEN/NOTIFY wake-ups for a worker. Polling is always the fallback.

Owns: one connection that LISTENs on the schema's channel and calls `wake(queue)` for each
notification naming one of the worker's queues. When the connection drops it reconnects with
backoff and, once listening again, wakes every queue so that nothing enqueued during the gap
waits for the next poll. Never raises out of `run`; it logs an outage once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pgqueue.link import Link
from pgqueue.queries import query

log = logging.getLogger("pgqueue.worker")


class Notifier:
    def __init__(self, dsn: str, schema: str, queues: set[str], wake: Callable[[], None]) -> None:
        self.link = Link(dsn, "listen")
        self.schema = schema
        self.queues = queues
        self.wake = wake

    async def run(self) -> None:
        """Listen until cancelled."""
        while True:
            try:
                await self.link.run(self._listen)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("notification listener failed, polling covers: %s", exc)
                await self.link.close()
                await asyncio.sleep(1.0)

    async def _listen(self, conn: Any) -> None:
        await conn.execute(query("worker_listen", self.schema))
        self.wake()  # anything enqueued while we were not listening
        async for note in conn.notifies():
            if note.payload in self.queues:
                self.wake()

    async def close(self) -> None:
        await self.link.close()
