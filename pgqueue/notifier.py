"""LISTEN/NOTIFY wake-ups for a worker. Polling is always the fallback.

Owns: one connection that LISTENs on the schema's channel and calls `wake(queue, position)`
for each notification naming one of the worker's queues. A payload is 'queue priority id', the
lowest (priority, id) made claimable (sql/queries/job.sql, job_insert), or a bare queue name
when the position is not known (position None). A payload '!cancel <id>' (job_cancel,
records.py) calls `on_cancel(id)` instead. When the connection drops it reconnects with
backoff and, once listening again, calls `relisten()`: nothing enqueued during the gap may wait
for the next poll, and where those jobs sit is not known. Never raises out of `run`; it logs
an outage once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pgqueue.claimer import Position
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
        wake: Callable[[str, Position | None], None],
        relisten: Callable[[], None],
        on_cancel: Callable[[int], None] | None = None,
    ) -> None:
        self.link = Link(dsn, "listen")
        self.schema = schema
        self.queues = queues
        self.wake = wake
        self.relisten = relisten
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
        self.relisten()  # anything enqueued while we were not listening
        async for note in conn.notifies():
            if note.payload.startswith(CANCEL_PAYLOAD):
                # Sent by job_cancel for a running job (records.py); no queue is so named.
                job_id = note.payload.removeprefix(CANCEL_PAYLOAD)
                if job_id.isdigit() and self.on_cancel is not None:
                    self.on_cancel(int(job_id))
                continue
            queue, position = parse_payload(note.payload)
            if queue in self.queues:
                self.wake(queue, position)

    async def close(self) -> None:
        await self.link.close()


def parse_payload(payload: str) -> tuple[str, Position | None]:
    """'queue priority id' -> (queue, (priority, id)); a bare queue name -> (queue, None).
    Queue names hold no spaces (models.QUEUE_NAME), so the split is unambiguous."""
    queue, _, rest = payload.partition(" ")
    priority, _, job_id = rest.partition(" ")
    try:
        return queue, (int(priority), int(job_id))
    except ValueError:
        return queue, None
