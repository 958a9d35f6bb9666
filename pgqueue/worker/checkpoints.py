"""Where a job's durable records commit (pgqueue/worker/durable.py): on the worker's steps link
(lease jobs), where the step records that the worker's jobs reach at the same time commit
together, one statement per round (StepRecorder), each caller waiting for its own; or in the
segments of the job's own transaction (atomic jobs: a record commits the segment with what
the handler wrote since the previous one, and the next segment locks the job's row again; the
record, the commit and the next segment's start go in one round trip).
Each backend runs plans for a `def` handler (`run`, blocking) or an `async def` one (`arun`);
the wrong twin is a ConfigurationError that names the right one.

Fails: JobLostError when the job is no longer this worker's at a segment's start (rescued
after the worker's lease lapsed), or a lease record could not be made in time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, NoReturn, TypeVar

import psycopg

from pgqueue.errors import ConfigurationError, PgQueueError
from pgqueue.models import ClaimedJob
from pgqueue.runtime.link import Link
from pgqueue.store import plan
from pgqueue.store.plan import AsyncConn, Pipelined, Plan, SyncConn
from pgqueue.store.steps import (
    Recorded,
    Segmented,
    StepRecord,
    record_many_plan,
    segment_discard_plan,
    segment_next,
    segment_record_next,
)

T = TypeVar("T")
# How long one record of a `def` handler's lease job may wait for the worker's event loop
# before the handler gives up (the worker is stopping, or the database is away).
_BLOCKING_WAIT = 300.0
# Records written by one statement, at most: a round carries what arrived while the previous
# one was written, so this bounds a statement's arrays, not how long a record waits.
RECORD_BATCH = 500
Made = tuple[Recorded, datetime] | None  # a record as made, or None: the job is not ours
_USE_AWAITED = (
    "this handler is `async def`: use the awaited twins (await ctx.astep(...), "
    "await ctx.asleep(...), await ctx.await_for_signal(...))"
)


class JobLostError(PgQueueError):
    """The job is no longer this worker's (rescued after its lease lapsed, or finished
    elsewhere): its handler stops at its next durable call, and its outcome is refused."""


class Backend:
    """Runs a job's durable statements: in transactions of their own on the worker's link
    (lease jobs), or in the segments of the job's own transaction (atomic jobs)."""

    atomic = False

    def run(self, make: Callable[[], Plan[T]]) -> T:
        raise ConfigurationError(_USE_AWAITED)

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        raise ConfigurationError(
            "this handler is a `def`: use ctx.step(...), ctx.sleep(...), "
            "ctx.wait_for_signal(...); the `a` twins are for `async def` handlers"
        )

    def record(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        """Make a step's record (`make` runs it alone); None when the job is not ours."""
        return self.run(make)

    async def arecord(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        """The async twin of `record`."""
        return await self.arun(make)

    def end(self, relock: bool) -> None:
        """After a record: commit the segment with it and open the next (atomic jobs)."""

    async def aend(self, relock: bool) -> None:
        """The async twin of `end`."""

    def discard(self) -> None:
        """A recorded call was replayed: roll back what the handler wrote before it in this
        segment (atomic jobs), which committed with the record the first time."""

    async def adiscard(self) -> None:
        """The async twin of `discard`."""


class StepRecorder:
    """Group-commits the step records of a worker's lease jobs on its steps link.

    Owns: the records asked for and not yet written. Records that arrive while a round is
    being written go together in the next: one statement, one transaction
    (job_step_record_many), and each caller waits for its own record's commit. Each record
    goes in only while its job is still this worker's; one whose job was moved comes back
    None to its caller alone. A deadlock is retried; a batch the database refuses otherwise is
    written one record at a time, so a record refused alone fails only its caller, with the
    database's error. Connection faults are the link's: it reconnects and writes the round
    again (a record that had committed is then found, not made twice).
    """

    def __init__(self, link: Link, schema: str, max_batch: int = RECORD_BATCH) -> None:
        self.link = link
        self.schema = schema
        self.max_batch = max_batch
        self._pending: list[tuple[StepRecord, asyncio.Future[Made]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.rounds = 0  # statements that wrote records
        self.records = 0  # records those statements carried

    async def record(self, record: StepRecord) -> Made:
        """Make `record`, together with those asked for meanwhile; returns once it committed
        (or was found already made), or None when its job is no longer this worker's."""
        made: asyncio.Future[Made] = asyncio.get_running_loop().create_future()
        self._pending.append((record, made))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="pgqueue-steps")
        # Shielded: a handler cancelled while its record is written leaves the round alone.
        return await asyncio.shield(made)

    async def _write_all(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            try:
                await self._write(batch)
            except asyncio.CancelledError:  # the worker's loop is closing
                for _, future in batch + self._pending:
                    future.cancel()
                raise

    async def _write(self, batch: list[tuple[StepRecord, asyncio.Future[Made]]]) -> None:
        """Settle each caller's future: its record as made, or the error that refused it."""
        try:
            made = await self._write_once([record for record, _ in batch])
        except psycopg.Error as exc:
            if len(batch) > 1:
                for one in batch:
                    await self._write([one])
                return
            _settle(batch[0][1], exc)
            return
        except Exception as exc:
            for _, future in batch:
                _settle(future, exc)
            return
        for (_, future), result in zip(batch, made, strict=True):
            if not future.done():
                future.set_result(result)

    async def _write_once(self, records: list[StepRecord]) -> list[Made]:
        for attempt in range(5):
            try:
                made = await self.link.run(
                    lambda conn: plan.run_async(
                        conn, record_many_plan(self.schema, records), together=False
                    )
                )
                break
            except psycopg.errors.TransactionRollback:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        self.rounds += 1
        self.records += len(records)
        return made


def _settle(future: asyncio.Future[Made], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)


class LeaseBackend(Backend):
    """A lease job's records, made by the worker's StepRecorder together with its other
    jobs' records; its other statements run alone on the steps link. A `def` handler's
    thread hands them to the worker's event loop and waits."""

    def __init__(self, recorder: StepRecorder, loop: asyncio.AbstractEventLoop) -> None:
        self.recorder = recorder
        self.link = recorder.link
        self.loop = loop

    def run(self, make: Callable[[], Plan[T]]) -> T:
        return self._blocking(lambda: self.arun(make))

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        # Shielded: a handler cancelled mid-record must not leave the link's connection in
        # the middle of a statement; the record completes (or fails) on its own.
        return await asyncio.shield(self.link.run(lambda conn: plan.run_async(conn, make())))

    def record(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        return self._blocking(lambda: self.arecord(make, record))

    async def arecord(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        return await self.recorder.record(record)

    def _blocking(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `work` on the worker's loop and wait for it, from a `def` handler's thread;
        ConfigurationError on the loop itself (an `async def` handler calling a `def` twin)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            future = asyncio.run_coroutine_threadsafe(work(), self.loop)
            try:
                return future.result(_BLOCKING_WAIT)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise JobLostError(
                    f"the worker could not record a step within {_BLOCKING_WAIT:g} s"
                ) from None
        raise ConfigurationError(_USE_AWAITED)


class _Segments:
    """What the atomic backends share. A record is sent with the end of its segment and the
    start of the next, one round trip (segment_record_next); the `end` that follows it then
    has nothing left to send, and tells only whether the job is still ours."""

    schema: str
    job: ClaimedJob
    _ended: Segmented | None = None  # a record's segment, ended with it

    def _recorded(self, ended: Segmented) -> Made:
        self._ended = ended
        return ended.made

    def _next(self, relock: bool) -> Pipelined[bool] | None:
        """The segment's end to send, or None when its record already ended it."""
        ended, self._ended = self._ended, None
        if ended is None:
            return segment_next(self.schema, self.job if relock else None)
        if not ended.ours:
            self._lost()
        return None

    def _lost(self) -> NoReturn:
        raise JobLostError(f"job {self.job.id} is no longer this worker's")


class AtomicBackend(_Segments, Backend):
    """An atomic job's records, in the segments of its transaction on a sync connection."""

    atomic = True

    def __init__(self, conn: SyncConn, schema: str, job: ClaimedJob) -> None:
        self.conn = conn
        self.schema = schema
        self.job = job

    def run(self, make: Callable[[], Plan[T]]) -> T:
        return plan.run(self.conn, make(), together=False)

    def record(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        work = segment_record_next(self.schema, record)
        return self._recorded(plan.run_pipelined(self.conn, work))

    def end(self, relock: bool) -> None:
        work = self._next(relock)
        if work is not None and not plan.run_pipelined(self.conn, work):
            self._lost()

    def discard(self) -> None:
        self.run(lambda: segment_discard_plan(self.schema))


class AsyncAtomicBackend(_Segments, Backend):
    """The async twin of AtomicBackend."""

    atomic = True

    def __init__(self, conn: AsyncConn, schema: str, job: ClaimedJob) -> None:
        self.conn = conn
        self.schema = schema
        self.job = job

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        return await plan.run_async(self.conn, make(), together=False)

    async def arecord(self, make: Callable[[], Plan[Made]], record: StepRecord) -> Made:
        work = segment_record_next(self.schema, record)
        return self._recorded(await plan.run_pipelined_async(self.conn, work))

    async def aend(self, relock: bool) -> None:
        work = self._next(relock)
        if work is not None and not await plan.run_pipelined_async(self.conn, work):
            self._lost()

    async def adiscard(self) -> None:
        await self.arun(lambda: segment_discard_plan(self.schema))
