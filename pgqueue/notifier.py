"""LISTEN/NOTIFY wake-ups for a worker. Polling is always the fallback.

Owns: one connection that LISTENs on the schema's channel and calls `wake(queue)` for each
notification naming one of the worker's queues, and `on_cancel(job_id)` for a request to
cancel a running job. When the connection drops it reconnects with backoff and, once
listening again, wakes every queue so that nothing enqueued during the gap waits for the next
poll. Never raises out of `run`; it logs an outage once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pgqueue.link import Link
from pgqueue.queries import query
from pgqueue.records import CANCEL_PAYLOAD

log = logging.getLogger("pgqueue.worker")


class Notifier:
    def __init__(
        self,
        dsn: str,
        schema: str,
        queues: set[str],
        wake: Callable[[], None],
        on_cancel: Callable[[int], None] | None = None,
    ) -> None:
        self.link = Link(dsn, "listen")
        self.schema = schema
        self.queues = queues
        self.wake = wake
        self.on_cancel = on_cancel

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
            elif note.payload.startswith(CANCEL_PAYLOAD) and self.on_cancel is not None:
                # Sent by job_cancel for a running job (records.py); no queue is so named.
                job_id = note.payload.removeprefix(CANCEL_PAYLOAD)
                if job_id.isdigit():
                    self.on_cancel(int(job_id))

    async def close(self) -> None:
        await self.link.close()
