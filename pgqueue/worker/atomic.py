"""Atomic jobs: claim, handler and completion in one transaction.

Owns: the worker's atomic lanes. Each lane has its own connection and runs one atomic job at
a time: BEGIN; claim one job with a row lock (job_claim_atomic); run the handler with that
connection in JobContext.connection, inside a savepoint; write the outcome (job_finish_many);
COMMIT. The handler's writes commit together with the job's completion, or not at all: a
failed attempt rolls them back to the savepoint and records the failure; a crash, a lost
connection or a forced stop rolls back everything and the job is claimable again at once,
without the rescuer (its attempt is not counted then).

A handler with durable steps (durable.py) cuts that transaction into segments: each step
commits what the handler wrote since the previous one with the step's record, and the next
segment locks the job's row again and sets a new savepoint; the outcome then commits with the
last segment. From its first step on, the job is committed as running for this worker, so a
crash leaves it to the rescuer (after the lease, by its task's `on_lost` policy), and its
next attempt replays the steps recorded. The lane opens and ends its transaction by
statements (store/steps.py), since a step ends it from inside the handler.

`async def` handlers get an AsyncConnection and run on the event loop; `def` handlers get a
sync Connection, and their lane runs the whole transaction in one thread. Lanes of each kind
claim only tasks of that kind.

The transaction is bounded, because a long transaction is what holds back VACUUM:
the task's timeout (default 60 s, at most 15 min) cancels an async handler; a sync handler
cannot be interrupted, so one that returns past its timeout is rolled back and recorded as
timed out; and idle_in_transaction_session_timeout is set a little past the timeout as a
server-side backstop for a worker that hangs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg

from pgqueue.models import ATOMIC_MAX_TIMEOUT, ClaimedJob, WorkerSettings
from pgqueue.registry import Registry
from pgqueue.runtime.link import connect
from pgqueue.store import plan
from pgqueue.store.jobs import (
    AtomicClaimParams,
    Finished,
    claim_atomic_plan,
    finish_plan,
    retake_atomic_plan,
)
from pgqueue.store.plan import AsyncConn, SyncConn
from pgqueue.store.steps import (
    segment_begin_plan,
    segment_commit_plan,
    segment_end_plan,
    segment_savepoint_plan,
)
from pgqueue.worker.executor import Executor
from pgqueue.worker.observe import Observers
from pgqueue.worker.outcome import Outcome

log = logging.getLogger("pgqueue.worker")
_BACKSTOP_MARGIN_MS = 30_000


class AtomicLane:
    def __init__(
        self,
        *,
        dsn: str,
        schema: str,
        queues: list[str],
        tasks: list[str],
        timeout_ms: int,
        executor: Executor,
        keep_history: bool,
        worker_id: int,
        stopping: Callable[[], bool],
        wait: Callable[[], Any],
        done: Callable[[], None],
        sync: bool = False,
        prepare: bool = True,
        observers: Observers | None = None,
    ) -> None:
        self.observers = observers or Observers()
        self.dsn = dsn
        self.prepare = prepare  # off behind PgBouncer's transaction pooling (poll_only)
        self.schema = schema
        self.executor = executor
        self.keep_history = keep_history
        self.stopping = stopping
        self.wait = wait
        self.done = done
        self.idle = False  # True once the lane's last look found no atomic job
        self.backstop_ms = timeout_ms + _BACKSTOP_MARGIN_MS
        self.claim_params = AtomicClaimParams(queues, tasks, worker_id)
        self.ran = 0
        self.sync = sync
        self._conn: AsyncConn | None = None
        self._sync_conn: SyncConn | None = None

    async def run(self) -> None:
        """Work atomic jobs until the worker stops; survives connection faults."""
        try:
            await self._loop()
        finally:
            await self._discard()

    async def _work(self) -> bool:
        if self.sync:
            # The whole transaction runs in one thread: a sync handler and its connection.
            return await asyncio.to_thread(self._one_sync)
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await connect(self.dsn, prepare=self.prepare, name="pgqueue:atomic")
        return await self._one(self._conn)

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
        sync_conn, self._sync_conn = self._sync_conn, None
        if sync_conn is not None:
            await asyncio.to_thread(sync_conn.close)

    async def _loop(self) -> None:
        delay, outage = 0.05, False
        while not self.stopping():
            # Not idle while looking: a lane that found nothing last time may be about to
            # claim a job another lane just put back for a retry (burst mode reads this).
            self.idle = False
            try:
                worked = await self._work()
                delay, outage = 0.05, False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Connection faults (psycopg's, or DatabaseError while the server is down)
                # and anything unexpected: the transaction is gone, the job is free again.
                if not outage:
                    log.error("atomic lane failed, reconnecting with backoff: %s", exc)
                outage = True
                await self._discard()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.idle = not worked
            if worked:
                self.done()
            else:
                await self.wait()

    def _claim(self) -> plan.Plan[ClaimedJob | None]:
        return claim_atomic_plan(self.schema, self.claim_params, self.backstop_ms)

    def _finish(self, outcome: Outcome) -> plan.Plan[Finished]:
        return finish_plan(self.schema, [outcome], self.keep_history)

    async def _one(self, conn: AsyncConn) -> bool:
        # Plans read with a cursor of their own: the handler gets the connection as it is.
        # The transaction is opened and ended by statements, not a context manager: a
        # handler's durable steps commit it and open the next one (durable.py, segments).
        begin = segment_begin_plan(self.schema, None, savepoint=False)
        await plan.run_async(conn, begin, together=False)
        job = await plan.run_async(conn, self._claim(), together=False)
        if job is None:
            await plan.run_async(conn, segment_commit_plan(self.schema), together=False)
            return False
        await plan.run_async(conn, segment_savepoint_plan(self.schema), together=False)
        self.observers.job_started(job)
        outcome = await self.executor.run(job, connection=conn)
        if _in_transaction(conn):
            try:
                await self._settle(conn, outcome)
            except psycopg.Error as exc:
                if _in_transaction(conn) or conn.broken:
                    raise
                outcome = self._refused(outcome, exc)
                await self._retake(conn, outcome)
        else:
            await self._retake(conn, outcome)
        self.observers.job_finished(job, outcome)
        self.ran += 1
        return True

    async def _settle(self, conn: AsyncConn, outcome: Outcome) -> None:
        """End the job's transaction with its outcome."""
        # The handler's writes since its last step stay only if it succeeded.
        keep = outcome.status == "succeeded"
        await plan.run_async(conn, segment_end_plan(self.schema, keep=keep), together=False)
        if not outcome.settled:
            await plan.run_async(conn, self._finish(outcome), together=False)
        await plan.run_async(conn, segment_commit_plan(self.schema), together=False)

    async def _retake(self, conn: AsyncConn, outcome: Outcome) -> None:
        """The database refused to commit the job's transaction, at a step or at its end: in
        a new one, take the job back and record that failure."""
        _log_refused(outcome)
        begin = segment_begin_plan(self.schema, None, savepoint=False)
        await plan.run_async(conn, begin, together=False)
        retake = retake_atomic_plan(self.schema, outcome.job)
        if await plan.run_async(conn, retake, together=False):
            await plan.run_async(conn, self._finish(outcome), together=False)
        await plan.run_async(conn, segment_commit_plan(self.schema), together=False)

    def _refused(self, outcome: Outcome, exc: psycopg.Error) -> Outcome:
        return self.executor.failed(outcome.job, exc, outcome.duration or 0.0)

    def _one_sync(self) -> bool:
        """The sync twin of _one, run in a thread on a sync connection."""
        if self._sync_conn is None or self._sync_conn.closed or self._sync_conn.broken:
            self._sync_conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                application_name="pgqueue:atomic",
                prepare_threshold=5 if self.prepare else None,
            )
        conn = self._sync_conn
        plan.run(conn, segment_begin_plan(self.schema, None, savepoint=False), together=False)
        job = plan.run(conn, self._claim(), together=False)
        if job is None:
            plan.run(conn, segment_commit_plan(self.schema), together=False)
            return False
        plan.run(conn, segment_savepoint_plan(self.schema), together=False)
        self.observers.job_started(job)
        outcome = self.executor.run_sync(job, conn)
        if _in_transaction(conn):
            try:
                self._settle_sync(conn, outcome)
            except psycopg.Error as exc:
                if _in_transaction(conn) or conn.broken:
                    raise
                outcome = self._refused(outcome, exc)
                self._retake_sync(conn, outcome)
        else:
            self._retake_sync(conn, outcome)
        self.observers.job_finished(job, outcome)
        self.ran += 1
        return True

    def _settle_sync(self, conn: SyncConn, outcome: Outcome) -> None:
        """The sync twin of _settle."""
        keep = outcome.status == "succeeded"
        plan.run(conn, segment_end_plan(self.schema, keep=keep), together=False)
        if not outcome.settled:
            plan.run(conn, self._finish(outcome), together=False)
        plan.run(conn, segment_commit_plan(self.schema), together=False)

    def _retake_sync(self, conn: SyncConn, outcome: Outcome) -> None:
        """The sync twin of _retake."""
        _log_refused(outcome)
        plan.run(conn, segment_begin_plan(self.schema, None, savepoint=False), together=False)
        if plan.run(conn, retake_atomic_plan(self.schema, outcome.job), together=False):
            plan.run(conn, self._finish(outcome), together=False)
        plan.run(conn, segment_commit_plan(self.schema), together=False)


def make_lanes(
    registry: Registry,
    settings: WorkerSettings,
    *,
    dsn: str,
    schema: str,
    executor: Executor,
    keep_history: bool,
    worker_id: int,
    stopping: Callable[[], bool],
    wait: Callable[[], Any],
    done: Callable[[], None],
    observers: Observers,
) -> list[AtomicLane]:
    """`atomic_concurrency` lanes for the async atomic tasks of `registry`, as many for the
    sync ones; none when it has no atomic task."""
    atomic = [t for t in registry if t.atomic and t.fn is not None]
    if not atomic or settings.atomic_concurrency == 0:
        return []
    timeout = max(t.policy.timeout or ATOMIC_MAX_TIMEOUT for t in atomic)
    lanes = []
    for sync in (False, True):
        tasks = sorted(t.name for t in atomic if t.is_async != sync)
        lanes += [
            AtomicLane(
                dsn=dsn,
                schema=schema,
                queues=list(settings.queues),
                tasks=tasks,
                timeout_ms=int(timeout.total_seconds() * 1000),
                executor=executor,
                keep_history=keep_history,
                worker_id=worker_id,
                stopping=stopping,
                wait=wait,
                done=done,
                sync=sync,
                prepare=not settings.poll_only,
                observers=observers,
            )
            for _ in range(settings.atomic_concurrency if tasks else 0)
        ]
    return lanes


def _in_transaction(conn: SyncConn | AsyncConn) -> bool:
    """Whether the job's transaction is still open; a commit the database refused (a step's,
    or the job's own) ended it."""
    return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def _log_refused(outcome: Outcome) -> None:
    job = outcome.job
    log.warning(
        "job %s %s attempt %s: the database refused to commit its transaction; "
        "what it wrote since its last step is rolled back and the attempt recorded as failed",
        job.id,
        job.task,
        job.attempt,
    )
