"""LISTEN/NOTIFY wake-ups for a worker. Polling is always the fallback.

Owns: one connection that LISTENs on the schema's channel and publishes what it hears as
events (events.py): `JobsAnnounced` for each wake-up naming one of the worker's queues,
`PauseChanged` when one of them is paused or resumed, `ControlsChanged` when a rate limit
concerning it changes, and `CancelRequested` for a request to stop a running job
(pgqueue/wakeup.py says what the payloads mean). When the connection drops it reconnects with
backoff and, once listening again, publishes `Relistened`: nothing enqueued during the gap may
wait for the next poll, and where those jobs sit is not known. Never raises out of `run`; it
logs an outage once.
"""

from __future__ import annotations

import asyncio
import logging

from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.store.plan import AsyncConn
from pgqueue.store.workers import WorkersStore
from pgqueue.wakeup import CancelRequest, PauseChange, RatesChange, Wake, parse
from pgqueue.worker.events import (
    Bus,
    CancelRequested,
    ControlsChanged,
    JobsAnnounced,
    PauseChanged,
    Relistened,
)

log = logging.getLogger("pgqueue.worker")


class Notifier(Loop):
    name = "notifier"

    def __init__(self, dsn: str, schema: str, queues: set[str], events: Bus) -> None:
        self.link = Link(dsn, "listen")
        self.schema = schema
        self.queues = queues
        self.events = events

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
        self.events.publish(Relistened())  # anything enqueued while we were not listening
        async for note in conn.notifies():
            notice = parse(note.payload)
            if isinstance(notice, Wake) and notice.queue in self.queues:
                self.events.publish(JobsAnnounced(notice.queue, notice.position))
            elif isinstance(notice, CancelRequest):
                self.events.publish(CancelRequested(notice.job_id))
            elif isinstance(notice, PauseChange) and notice.queue in self.queues:
                self.events.publish(PauseChanged(notice.queue, notice.paused))
            elif isinstance(notice, RatesChange) and (
                notice.queue in self.queues or notice.queue == "*"
            ):
                self.events.publish(ControlsChanged(notice.queue))

    async def close(self) -> None:
        await self.link.close()
