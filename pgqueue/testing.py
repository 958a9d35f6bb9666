"""Helpers for users' own tests: drain a queue in-process, list what was enqueued.

Both run against a real database; neither mocks anything.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgqueue.claimer import WorkerStats
from pgqueue.models import Job
from pgqueue.queries import query
from pgqueue.queue import AsyncQueue, Queue, decode_job
from pgqueue.worker import Worker


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
    conn: psycopg.Connection[Any], queue: Queue | AsyncQueue, *, task: str | None = None
) -> list[Job]:
    """Jobs still waiting or running in the hot table (visible to `conn`), oldest first."""
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(query("job_list_live", queue.schema), {"task": task})
        rows = cur.fetchall()
    return [job for job in map(decode_job, rows) if job is not None]
