"""Finds running jobs whose worker died and applies each task's on_lost policy.

Owns: the rescue loop, a service of every worker (runtime/service.py): every rescue_interval
(± 50%) one rescue pass, then a sweep of the concurrency slots of dead workers
(pgqueue/store/concurrency.py). A pass runs inside a transaction that first takes a
try-advisory lock, so only one rescuer acts at a time. A job
is stranded when its worker has not heartbeated for longer than lease_timeout: a dead worker's jobs
are back within about lease + one rescue interval, never sooner, and a worker that keeps
heartbeating never loses a job however long it runs. A running job whose worker row is gone
(job_find_orphaned, sql/queries/jobs.sql) is looked for on the first pass and then every
ORPHAN_PASSES passes, among the running jobs of the workers whose rows were removed (each
removal is recorded, migration 0042), so the look never walks the other running entries.

Sooner when PostgreSQL saw the death: at start, then every SESSION_CHECK (± 50%) and as a
suspect's grace ends, the loop also looks for workers whose recorded session the server no
longer has (pgqueue/worker/heartbeat.py records it; worker_sessions_gone in
sql/queries/workers.sql), so a worker that has just started finds one that died before it. A
worker seen so at every look for session_grace, under one recorded session, is dead: its
process is gone, or it could not open a new session in that time. It is removed and its running
jobs rescued in one transaction, under the rescue lock, guarded on the session it was seen
with, so a worker that recorded a new session meanwhile is left alone. A live worker whose
session the server ends records a new one in far less; a worker whose session went with a
server restart, or that has no session of its own (PgBouncer), is left to its lease. A worker
that hangs, or is cut off from the database while its session stays open, keeps its session:
the lease speaks for it.

Policies (TaskPolicy.on_lost): retry (counts the attempt; backoff as for a failure; failed once
attempts run out), fail, abandon (failed, and a NOTIFY on the dead-job channel), and compensate
(failed, and the named compensating task enqueued in the same transaction with job_id, task and
args). Outcomes go through job_finish_many, guarded on the dead worker's id and the attempt, so a
worker that comes back late cannot overwrite the rescue.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from pgqueue.errors import PgQueueError
from pgqueue.models import ClaimedJob, NewJob, TaskPolicy
from pgqueue.registry import Registry
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.store import concurrency
from pgqueue.store.jobs import JobsStore
from pgqueue.store.plan import AsyncConn
from pgqueue.store.workers import GoneSession, WorkersStore
from pgqueue.worker.events import Bus, JobsClaimable
from pgqueue.worker.outcome import Outcome

log = logging.getLogger("pgqueue.rescuer")
_DEFAULT = TaskPolicy()
ORPHAN_PASSES = 6  # about once a minute per worker at the default rescue_interval
SESSION_CHECK = timedelta(seconds=0.5)  # between looks for ended sessions
# How long a worker's recorded session must stay gone before the worker is dead: far longer
# than a live worker takes to open a new session and record it, and short enough that a dead
# one's jobs are back within seconds.
SESSION_GRACE = timedelta(seconds=2)
GRACE_SLACK = 0.01  # seconds past a grace's end for the look that ends it, so it has ended


class Rescuer(Loop):
    name = "rescuer"

    def __init__(
        self,
        registry: Registry,
        schema: str,
        lease: timedelta,
        keep_history: bool,
        *,
        link: Link | None = None,
        interval: timedelta = timedelta(seconds=10),
        events: Bus | None = None,
        queues: Sequence[str] = (),
        worker_id: int = 0,
        session_grace: timedelta = SESSION_GRACE,
    ) -> None:
        """`link`, `interval` and `queues` are for the loop; `events` hears `JobsClaimable`
        when a pass, a sweep or a look at sessions may have made jobs claimable. `worker_id`
        is the rescuer's own worker, never taken for dead by its session."""
        self.registry = registry
        self.schema = schema
        self.lease = lease
        self.keep_history = keep_history
        self.link = link
        self.interval = interval.total_seconds()
        self.events = events
        self.queues = list(queues)
        self.store = JobsStore(schema)
        self.workers = WorkersStore(schema)
        self.worker_id = worker_id
        self.gone = GoneSessions(session_grace)
        self.rescued = 0
        self.passes = 0

    async def loop(self) -> None:
        await asyncio.gather(
            self.every(self.interval, self._round),
            self._watch_sessions(),
        )

    async def _watch_sessions(self) -> None:
        """Look at once, then every SESSION_CHECK (± 50%), but while a worker's session is
        missing, again as soon as its grace ends: its jobs wait for no more than they must."""
        check = SESSION_CHECK.total_seconds()
        while True:
            try:
                await self._look_at_sessions()
            except Exception as exc:
                log.error("%s failed, trying again next interval: %s", self.name, exc)
            wait = check * random.uniform(0.5, 1.5)
            due = self.gone.due_in()
            if due is not None:
                wait = min(wait, due.total_seconds() + GRACE_SLACK)
            await asyncio.sleep(wait)

    async def _look_at_sessions(self) -> None:
        assert self.link is not None, "a Rescuer runs its loop on a link"
        if await self.link.run(self.rescue_gone):
            self._claimable()  # rescued jobs may be claimable now

    async def _round(self) -> None:
        assert self.link is not None, "a Rescuer runs its loop on a link"
        if await self.link.run(self.rescue):
            self._claimable()  # rescued jobs may be claimable now
        if await self.link.run(lambda conn: concurrency.sweep(conn, self.schema)):
            self._claimable()  # waiting jobs of keys with room are queued again
        if self.queues:
            await self.link.run(self.fail_out_of_range)

    def _claimable(self) -> None:
        if self.events is not None:
            self.events.publish(JobsClaimable())

    async def fail_out_of_range(self, conn: AsyncConn) -> int:
        """Fail the scheduled jobs of this worker's queues that no worker could ever run: their
        run_at is past year 9999 (written behind the API's back). Returns how many."""
        failed = await self.store.fail_out_of_range(conn, self.queues, 1000, self.keep_history)
        if failed:
            log.error("failed %d scheduled jobs whose run_at is after year 9999", failed)
        return failed

    async def rescue(self, conn: AsyncConn, limit: int = 1000) -> int:
        """One pass on `conn` (autocommit). Returns how many jobs it rescued."""
        async with conn.transaction():
            if not await self.workers.rescue_lock(conn):
                return 0  # another worker is rescuing right now
            jobs = await self.store.find_stranded(conn, self.lease, limit)
            if self.passes % ORPHAN_PASSES == 0 and len(jobs) < limit:
                jobs += await self.store.find_orphaned(conn, limit - len(jobs))
                await self.workers.prune_removed(conn, self.lease)
            self.passes += 1
            if jobs:
                await self._apply(conn, jobs)
            await self.workers.delete_dead(conn, self.lease)
        self.rescued += len(jobs)
        return len(jobs)

    async def rescue_gone(self, conn: AsyncConn, limit: int = 1000) -> int:
        """One look for workers whose session ended, on `conn` (autocommit): those seen gone
        for the session grace are removed and all their running jobs rescued. Returns how
        many jobs it rescued."""
        dead = self.gone.dead(await self.workers.sessions_gone(conn, self.worker_id))
        if not dead:
            return 0
        rescued = 0
        async with conn.transaction():
            if not await self.workers.rescue_lock(conn):
                return 0  # another worker is rescuing: the next look tries again
            ids = await self.workers.delete_gone(conn, dead)
            while ids:
                jobs = await self.store.find_of_workers(conn, ids, limit)
                if jobs:
                    await self._apply(conn, jobs, session_ended=True)
                rescued += len(jobs)
                if len(jobs) < limit:
                    break
        self.rescued += rescued
        return rescued

    async def _apply(
        self, conn: AsyncConn, jobs: list[ClaimedJob], *, session_ended: bool = False
    ) -> None:
        outcomes: list[Outcome] = []
        follow_ups: list[NewJob] = []
        dead: list[ClaimedJob] = []
        for job in jobs:
            outcome, follow_up = self._decide(job, session_ended)
            outcomes.append(outcome)
            if follow_up is not None:
                follow_ups.append(follow_up)
            elif outcome.error and outcome.error["kind"] == "abandoned":
                dead.append(job)
        await self.store.finish_many(conn, outcomes, self.keep_history)
        if follow_ups:
            await self.store.insert_jobs(conn, follow_ups)
        for job in dead:
            await self.workers.notify_dead_job(
                conn, {"id": job.id, "task": job.task, "queue": job.queue}
            )
        log.warning(
            "rescued %d jobs from dead workers %s: %s",
            len(jobs),
            sorted({j.worker_id for j in jobs}),
            ", ".join(f"{o.job.id}->{o.status}" for o in outcomes[:20]),
        )

    def _decide(self, job: ClaimedJob, session_ended: bool) -> tuple[Outcome, NewJob | None]:
        try:
            policy = self.registry.get(job.task).policy
        except PgQueueError:
            policy = _DEFAULT
        if session_ended:
            reason = (
                f"worker {job.worker_id}'s database session ended and no new one took its "
                "place; the job was presumed lost"
            )
        else:
            reason = (
                f"worker {job.worker_id} stopped heartbeating for over "
                f"{self.lease.total_seconds():g} s; the job was presumed lost"
            )
        if policy.on_lost == "retry" and job.attempt < job.max_attempts:
            retry_in = policy.retry.delay(job.attempt).total_seconds()
            return Outcome(
                job, "retry", None, error=_error(job, "lost", reason), retry_in=retry_in
            ), None
        if policy.on_lost == "compensate" and policy.compensate_with:
            try:
                follow_up = self.registry.get(policy.compensate_with).job(
                    job_id=job.id, task=job.task, args=job.args
                )
            except PgQueueError as exc:
                reason += f"; compensation {policy.compensate_with!r} could not be enqueued: {exc}"
                return Outcome(job, "failed", None, error=_error(job, "abandoned", reason)), None
            reason += f"; compensating task {policy.compensate_with!r} enqueued"
            return Outcome(job, "failed", None, error=_error(job, "compensated", reason)), (
                follow_up
            )
        kind = "abandoned" if policy.on_lost == "abandon" else "lost"
        return Outcome(job, "failed", None, error=_error(job, kind, reason)), None


class GoneSessions:
    """What one rescuer has seen of workers' recorded sessions: which were gone at every look
    since when, under which recorded session."""

    def __init__(self, grace: timedelta) -> None:
        self.grace = grace
        # worker id -> ((session pid, session start), first seen gone)
        self._since: dict[int, tuple[tuple[int, datetime], datetime]] = {}
        self._last: datetime | None = None  # when the last look that found any was made

    @property
    def suspects(self) -> frozenset[int]:
        """The workers whose session was gone at the last look."""
        return frozenset(self._since)

    def due_in(self) -> timedelta | None:
        """How long after the last look the first suspect's grace ends (None: no suspect)."""
        if not self._since or self._last is None:
            return None
        first = min(since for _, since in self._since.values())
        return max(first + self.grace - self._last, timedelta(0))

    def dead(self, seen: Sequence[GoneSession]) -> list[GoneSession]:
        """Record one look (`seen`: the workers whose session was gone); returns those gone at
        every look for at least the grace under the same session. A worker missing from a
        look, or seen under a new session, starts again."""
        since: dict[int, tuple[tuple[int, datetime], datetime]] = {}
        for gone in seen:
            session = (gone.session_pid, gone.session_start)
            was, first = self._since.get(gone.worker_id, (session, gone.seen_at))
            if was != session:
                first = gone.seen_at
            since[gone.worker_id] = (session, first)
        self._since = since
        self._last = max((g.seen_at for g in seen), default=None)
        return [g for g in seen if g.seen_at - since[g.worker_id][1] >= self.grace]


def _error(job: ClaimedJob, kind: str, reason: str) -> dict[str, Any]:
    return {
        "attempt": job.attempt,
        "at": datetime.now(timezone.utc).isoformat(),
        "kind": kind,
        "error": reason,
        "traceback": "",
    }
