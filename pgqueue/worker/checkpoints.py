"""Where a job's durable records commit (pgqueue/durable.py): on the worker's link, each in
a transaction of its own (lease jobs), or in the segments of the job's own transaction (atomic
jobs: a record commits the segment with what the handler wrote since the previous one, and the
next segment locks the job's row again). Each backend runs plans for a `def` handler (`run`,
blocking) or an `async def` one (`arun`); the wrong twin is a ConfigurationError that names the
right one.

Fails: JobLostError when the job is no longer this worker's at a segment's start (rescued
after the worker's lease lapsed), or a lease record could not be made in time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from pgqueue.errors import ConfigurationError, PgQueueError
from pgqueue.models import ClaimedJob
from pgqueue.runtime.link import Link
from pgqueue.store import plan
from pgqueue.store.plan import AsyncConn, Plan, SyncConn
from pgqueue.store.steps import (
    segment_begin_plan,
    segment_commit_plan,
    segment_discard_plan,
    segment_end_plan,
)

T = TypeVar("T")
# How long one record of a `def` handler's lease job may wait for the worker's event loop
# before the handler gives up (the worker is stopping, or the database is away).
_BLOCKING_WAIT = 300.0


class JobLostError(PgQueueError):
    """The job is no longer this worker's (rescued after its lease lapsed, or finished
    elsewhere): its handler stops at its next durable call, and its outcome is refused."""


class Backend:
    """Runs a job's durable statements: in transactions of their own on the worker's link
    (lease jobs), or in the segments of the job's own transaction (atomic jobs)."""

    atomic = False

    def run(self, make: Callable[[], Plan[T]]) -> T:
        raise ConfigurationError(
            "this handler is `async def`: use the awaited twins (await ctx.astep(...), "
            "await ctx.asleep(...), await ctx.await_for_signal(...))"
        )

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        raise ConfigurationError(
            "this handler is a `def`: use ctx.step(...), ctx.sleep(...), "
            "ctx.wait_for_signal(...); the `a` twins are for `async def` handlers"
        )

    def end(self, relock: bool) -> None:
        """After a record: commit the segment with it and open the next (atomic jobs)."""

    async def aend(self, relock: bool) -> None:
        """The async twin of `end`."""

    def discard(self) -> None:
        """A recorded call was replayed: roll back what the handler wrote before it in this
        segment (atomic jobs), which committed with the record the first time."""

    async def adiscard(self) -> None:
        """The async twin of `discard`."""


class LeaseBackend(Backend):
    """A lease job's records, each committed on its own on the worker's link. A `def`
    handler's thread hands its statements to the worker's event loop and waits."""

    def __init__(self, link: Link, loop: asyncio.AbstractEventLoop) -> None:
        self.link = link
        self.loop = loop

    def run(self, make: Callable[[], Plan[T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            future = asyncio.run_coroutine_threadsafe(self.arun(make), self.loop)
            try:
                return future.result(_BLOCKING_WAIT)
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise JobLostError(
                    f"the worker could not record a step within {_BLOCKING_WAIT:g} s"
                ) from None
        return super().run(make)

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        # Shielded: a handler cancelled mid-record must not leave the link's connection in
        # the middle of a statement; the record completes (or fails) on its own.
        return await asyncio.shield(self.link.run(lambda conn: plan.run_async(conn, make())))


class AtomicBackend(Backend):
    """An atomic job's records, in the segments of its transaction on a sync connection."""

    atomic = True

    def __init__(self, conn: SyncConn, schema: str, job: ClaimedJob) -> None:
        self.conn = conn
        self.schema = schema
        self.job = job

    def run(self, make: Callable[[], Plan[T]]) -> T:
        return plan.run(self.conn, make(), together=False)

    def end(self, relock: bool) -> None:
        self.run(lambda: segment_end_plan(self.schema, keep=True))
        self.run(lambda: segment_commit_plan(self.schema))
        if not self.run(lambda: segment_begin_plan(self.schema, self.job if relock else None)):
            raise JobLostError(f"job {self.job.id} is no longer this worker's")

    def discard(self) -> None:
        self.run(lambda: segment_discard_plan(self.schema))


class AsyncAtomicBackend(Backend):
    """The async twin of AtomicBackend."""

    atomic = True

    def __init__(self, conn: AsyncConn, schema: str, job: ClaimedJob) -> None:
        self.conn = conn
        self.schema = schema
        self.job = job

    async def arun(self, make: Callable[[], Plan[T]]) -> T:
        return await plan.run_async(self.conn, make(), together=False)

    async def aend(self, relock: bool) -> None:
        await self.arun(lambda: segment_end_plan(self.schema, keep=True))
        await self.arun(lambda: segment_commit_plan(self.schema))
        if not await self.arun(
            lambda: segment_begin_plan(self.schema, self.job if relock else None)
        ):
            raise JobLostError(f"job {self.job.id} is no longer this worker's")

    async def adiscard(self) -> None:
        await self.arun(lambda: segment_discard_plan(self.schema))
