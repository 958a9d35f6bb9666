"""Helpers for users' own tests: drain a queue in-process, list what was enqueued.

Both run against a real database; neither mocks anything.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pgqueue.models import Job
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.store import plan
from pgqueue.store.jobs import list_live_plan
from pgqueue.store.plan import SyncConn
from pgqueue.worker.observe import WorkerStats
from pgqueue.worker.worker import Worker

__all__ = ["WorkerStats", "adrain", "drain", "enqueued_jobs"]


def drain(queue: Queue | AsyncQueue, *, dsn: str | None = None, **settings: Any) -> WorkerStats:
    """Run a burst worker in this process until the queues are empty; returns its stats.

    Settings are WorkerSettings fields (queues, concurrency, ...). Jobs scheduled in the
    future are left alone. Call from sync code; from async code use `adrain`.
    """
    return asyncio.run(adrain(queue, dsn=dsn, **settings))


async def adrain(
    queue: Queue | AsyncQueue, *, dsn: str | None = None, **settings: Any
) -> WorkerStats:
    target = dsn or queue.dsn
    if target is None:
        raise ValueError("drain needs a dsn: pass dsn= or create the queue with one")
    settings.setdefault("burst", True)
    worker = Worker(queue, dsn=target, **settings)
    await worker.run_async()
    return worker.stats


def enqueued_jobs(
    conn: SyncConn, queue: Queue | AsyncQueue, *, task: str | None = None
) -> list[Job]:
    """Jobs still waiting or running in the hot table (visible to `conn`), oldest first."""
    return plan.run(conn, list_live_plan(queue.schema, task), together=False)
