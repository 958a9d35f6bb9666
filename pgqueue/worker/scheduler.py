"""The scheduler every worker runs for the recurring jobs its application defines.

Owns: one pass (one transaction on the worker's `periodic` connection) that locks the
definitions' rows, decides with schedule.decide which ticks are due, claims them in
periodic_ticks and enqueues a job for each tick it claimed through the ordinary job_insert
(so workers are woken the standard way), then sleeps until the next tick of any definition.

Invariants: a tick becomes a job exactly once across any number of workers and processes:
the primary key (name, tick) admits it once and the job is inserted in the same transaction,
so a rolled-back pass leaves the tick free for the next one. No worker leads: every worker
passes at every tick and the database sorts them out.

Failures: a lost connection is retried by the Link. A worker frozen in the middle of a pass
(SIGSTOP, a blocked event loop) holds the row locks only until PostgreSQL ends its idle
transaction (idle_backstop, 10 s); the other workers then go on. Any other error (for
example the tables of migration 0004 missing) is logged and the pass retried later. The
scheduler never stops the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from datetime import datetime, timedelta

from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.schedule import Entry, PassDecision, Schedules, decide
from pgqueue.store.jobs import JobsStore
from pgqueue.store.periodic import PeriodicStore, Tick, TickJob
from pgqueue.store.plan import AsyncConn, run_async
from pgqueue.store.workers import bound_idle

log = logging.getLogger("pgqueue.periodic")
MAX_SLEEP = timedelta(minutes=1)  # also how soon a new definition's first pass may come
RETRY_AFTER = timedelta(seconds=10)
WAKE_MARGIN = timedelta(milliseconds=5)  # wake just after the tick, never just before it
IDLE_BACKSTOP = timedelta(seconds=10)  # the server ends a pass frozen (idle) for longer


@dataclasses.dataclass
class PassResult:
    """What one pass did: the database's time, the jobs it enqueued, the next tick."""

    now: datetime
    enqueued: list[tuple[str, datetime, int]]
    next_tick: datetime


class Scheduler(Loop):
    """Schedules `schedules` for the worker `worker_id` on the worker's schema; as a service,
    passes at every tick on `link`, a connection of its own."""

    name = "periodic"

    def __init__(
        self,
        schedules: Schedules,
        schema: str,
        worker_id: int,
        *,
        idle_backstop: timedelta = IDLE_BACKSTOP,
        link: Link | None = None,
    ) -> None:
        self.entries = list(schedules)
        self.schema = schema
        self.worker_id = worker_id
        self.idle_backstop = idle_backstop
        self.link = link
        self.store = PeriodicStore(schema)
        self.jobs = JobsStore(schema)
        self.passes = 0
        self.enqueued = 0

    async def run_pass(self, conn: AsyncConn, now: datetime | None = None) -> PassResult:
        """One pass in one transaction on `conn` (autocommit). `now` pins time for tests."""
        entries = {e.periodic.name: e for e in self.entries}
        definitions_by_name = {e.periodic.name: e.periodic.definition() for e in self.entries}
        definitions = list(definitions_by_name.items())
        async with conn.transaction():
            # A worker that freezes mid-pass must not hold the definitions' row locks, and so
            # every other worker's scheduler, for longer than this.
            backstop = int(self.idle_backstop.total_seconds() * 1000)
            await run_async(conn, bound_idle(self.schema, backstop), together=False)
            await self.store.ensure(conn, definitions, now)
            states = await self.store.lock(conn, sorted(entries), now)
            db_now = states[0].now
            plans = {
                s.name: decide(entries[s.name].periodic, s.definition, s.last_tick, db_now)
                for s in states
            }
            wanted = [Tick(name, tick) for name, p in plans.items() for tick in p.enqueue]
            claimed = await self.store.claim_ticks(conn, wanted, self.worker_id, now)
            enqueued = await self._enqueue(conn, entries, claimed, now)
            advanced = [
                (n, entries[n].periodic.definition(), p.last_tick) for n, p in plans.items()
            ]
            await self.store.advance(conn, advanced, now)
        self.passes += 1
        self.enqueued += len(enqueued)
        for name, p in plans.items():
            _report(name, p, entries[name])
        next_tick = min(e.periodic.next_after(db_now) for e in self.entries)
        return PassResult(db_now, [(t.name, t.tick, t.job_id) for t in enqueued], next_tick)

    async def loop(self) -> None:
        assert self.link is not None, "a Scheduler runs its loop on a link"
        while True:
            try:
                result = await self.link.run(self.run_pass)
                wait = min(result.next_tick - result.now + WAKE_MARGIN, MAX_SLEEP)
            except Exception as exc:  # any failure: log, keep the worker, retry later
                log.error("periodic scheduler pass failed, retrying in %s: %s", RETRY_AFTER, exc)
                wait = RETRY_AFTER
            await asyncio.sleep(max(wait.total_seconds(), 0.0))

    async def close(self) -> None:
        if self.link is not None:
            await self.link.close()

    async def _enqueue(
        self,
        conn: AsyncConn,
        entries: dict[str, Entry],
        claimed: list[Tick],
        now: datetime | None,
    ) -> list[TickJob]:
        if not claimed:
            return []
        claimed = sorted(claimed, key=lambda t: (t.name, t.tick))
        ids = await self.jobs.insert_jobs(conn, [entries[t.name].job for t in claimed], now)
        links = [TickJob(t.name, t.tick, i) for t, i in zip(claimed, ids, strict=True)]
        await self.store.link_ticks(conn, links)
        return links


def _report(name: str, p: PassDecision, entry: Entry) -> None:
    if p.changed:
        log.info(
            "periodic job %s: definition changed; ticks missed before the change are not caught up",
            name,
        )
    if p.missed is not None:
        first, last = p.missed
        what = (
            f"one job enqueued for {last.isoformat()} (missed='run_once')"
            if entry.periodic.missed == "run_once"
            else "not enqueued (missed='skip')"
        )
        log.warning(
            "periodic job %s: ticks from %s to %s were missed while no worker ran: %s",
            name,
            first.isoformat(),
            last.isoformat(),
            what,
        )
