"""The history's daily partitions: made ahead of time by every worker, dropped by retention.

Owns: the upkeep rounds (pgqueue/migrate.py's upkeep, which a migrate runs too) that call
history_partitions_step (sql/migrations/0016_history_
partitions.sql) until it has nothing left to do: at the worker's start and then every
PARTITION_INTERVAL (± 50%). A round makes the partitions of the next AHEAD_DAYS days, and on
an installation upgraded with history in place, first moves the old rows from the default
position to a range of their own, one short step per transaction.

Invariants: one worker keeps the partitions at a time (the functions take a try-advisory
lock, and the others return at once). A lock that cannot be had within LOCK_MS fails the
step, and the next round tries again: waiting longer would queue every finishing job behind
it. A day without a partition loses nothing: its rows land in the default partition.

Fails: a failed round is logged and the next one comes as usual; the worker goes on.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from pgqueue.migrate import upkeep_async
from pgqueue.runtime.link import connect
from pgqueue.runtime.service import Loop

log = logging.getLogger("pgqueue.retention")
PARTITION_INTERVAL = timedelta(hours=1)


class HistoryPartitions(Loop):
    name = "history partitions"

    def __init__(self, dsn: str, schema: str, *, prepare: bool = True) -> None:
        self.dsn = dsn
        self.schema = schema
        self.prepare = prepare

    async def upkeep(self) -> list[str]:
        """One round, on a connection of its own for the round; what its steps did."""
        conn = await connect(self.dsn, prepare=self.prepare, name="pgqueue:partitions")
        try:
            return await upkeep_async(conn, self.schema)
        finally:
            await conn.close()

    async def loop(self) -> None:
        """A round at start, then one every PARTITION_INTERVAL (± 50%)."""
        try:
            await self.upkeep()
        except Exception as exc:  # as Loop.every: the next round comes as usual
            log.error("%s failed, trying again next interval: %s", self.name, exc)
        await self.every(PARTITION_INTERVAL.total_seconds(), self.upkeep)
