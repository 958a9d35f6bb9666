"""The horizon watch: a worker's warning that VACUUM is held back.

Owns: one check every rescue interval (± 50%) for sessions, replication slots and prepared
transactions that have held the xmin horizon back for longer than `warn_after`. While one does,
VACUUM cannot remove the jobs table's dead rows, and every claim walks more of them; the watch
names the oldest holder in a warning, at most once a minute, so an operator can end it. A
failed check is logged by the service and the worker goes on.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.store.health import HorizonHolder, horizon_holders_async
from pgqueue.store.plan import AsyncConn

log = logging.getLogger("pgqueue.worker")
WARNING_EVERY = 60.0  # seconds between two warnings of one worker


class HorizonWatch(Loop):
    name = "horizon"

    def __init__(self, link: Link, schema: str, interval: timedelta, warn_after: timedelta) -> None:
        self.link = link
        self.schema = schema
        self.interval = interval.total_seconds()
        self.warn_after = warn_after
        self.checks = 0
        self._next_warning = 0.0

    async def loop(self) -> None:
        await self.every(self.interval, self.check)

    async def check(self) -> None:
        """Warn if something holds the horizon back, unless this worker warned lately."""
        self.checks += 1
        if time.monotonic() < self._next_warning:
            return
        holders = await self.link.run(self._holders)
        if not holders:
            return
        top = holders[0]
        self._next_warning = time.monotonic() + WARNING_EVERY
        log.warning(
            "%d sessions have held back the xmin horizon for over %s, so VACUUM cannot clean "
            "the jobs table; the oldest: %s pid=%s application=%r state=%s age=%s query=%r "
            "(see `pgqueue status`, `pgqueue watchdog`)",
            len(holders),
            self.warn_after,
            top.kind,
            top.pid,
            top.application_name,
            top.state,
            top.age,
            (top.query or "")[:80],
        )

    async def _holders(self, conn: AsyncConn) -> list[HorizonHolder]:
        return await horizon_holders_async(conn, self.warn_after)
