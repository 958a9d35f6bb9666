"""LISTEN/NOTIFY wake-ups for a worker. Polling is always the fallback.

Owns: one connection that LISTENs on the schema's channel and calls `wake(queue, position)`
for each notification naming one of the worker's queues, `on_pause(queue, paused)` when one of
them is paused or resumed, `on_rates(queue)` when its rate limit changes, and `on_cancel(id)`
for a request to stop a running job (pgqueue/wakeup.py says what the payloads mean). When the
connection drops it reconnects with backoff and, once listening again, calls `relisten()`:
nothing enqueued during the gap may wait for the next poll, and where those jobs sit is not
known. Never raises out of `run`; it logs an outage once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.store.plan import AsyncConn
from pgqueue.store.workers import WorkersStore
from pgqueue.wakeup import CancelRequest, PauseChange, Position, RatesChange, Wake, parse

log = logging.getLogger("pgqueue.worker")


class Notifier(Loop):
    name = "notifier"

    def __init__(
        self,
        dsn: str,
        schema: str,
        queues: set[str],
        wake: Callable[[str, Position | None], None],
        relisten: Callable[[], None],
        on_cancel: Callable[[int], None] | None = None,
        on_pause: Callable[[str, bool], None] | None = None,
        on_rates: Callable[[str], None] | None = None,
    ) -> None:
        self.link = Link(dsn, "listen")
        self.schema = schema
        self.queues = queues
        self.wake = wake
        self.relisten = relisten
        self.on_cancel = on_cancel
        self.on_pause = on_pause
        self.on_rates = on_rates

    async def loop(self) -> None:
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

    async def _listen(self, conn: AsyncConn) -> None:
        await WorkersStore(self.schema).listen(conn)
        self.relisten()  # anything enqueued while we were not listening
        async for note in conn.notifies():
            notice = parse(note.payload)
            if isinstance(notice, Wake) and notice.queue in self.queues:
                self.wake(notice.queue, notice.position)
            elif isinstance(notice, CancelRequest) and self.on_cancel is not None:
                self.on_cancel(notice.job_id)
            elif (
                isinstance(notice, PauseChange)
                and notice.queue in self.queues
                and self.on_pause is not None
            ):
                self.on_pause(notice.queue, notice.paused)
            elif (
                isinstance(notice, RatesChange)
                and (notice.queue in self.queues or notice.queue == "*")
                and self.on_rates is not None
            ):
                self.on_rates(notice.queue)

    async def close(self) -> None:
        await self.link.close()
