"""Per-task timeouts: an async job is cancelled, a sync job is abandoned; both fail or retry."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pgqueue import JobContext, Queue, RetryPolicy
from pgqueue.testing import drain


def test_async_job_over_its_timeout_is_cancelled_and_retried_then_failed(
    queue: Queue, conn: Any
) -> None:
    cancelled: list[int] = []

    @queue.task(name="slow", timeout=0.05, max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    async def slow(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.attempt)
            raise

    job_id = queue.enqueue(slow.job(), conn=conn)
    conn.commit()
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 2
    assert cancelled == [1, 2]
    assert [e["error"] for e in job.errors] == [
        "JobTimeoutError: the job ran longer than its timeout of 0.05 s"
    ] * 2


def test_sync_job_over_its_timeout_fails_and_frees_its_slot(queue: Queue, conn: Any) -> None:
    release = threading.Event()
    inside = threading.Event()
    stuck_was_inside: list[bool] = []

    @queue.task(name="stuck", timeout=0.05, max_attempts=1)
    def stuck() -> None:
        inside.set()
        release.wait(30)  # cannot be interrupted: it runs on after the timeout
        inside.clear()

    @queue.task(name="next")
    def after() -> None:
        stuck_was_inside.append(inside.is_set())

    stuck_id = queue.enqueue(stuck.job(), conn=conn)
    queue.enqueue(after.job(), conn=conn, priority=5)
    conn.commit()
    drain(queue, concurrency=1)
    release.set()
    # The one slot, and a thread, were free for the next job while the stuck one ran on.
    assert stuck_was_inside == [True]
    job = queue.get_job(stuck_id)
    assert job is not None and job.status == "failed"
    assert (job.last_error or "").startswith("JobTimeoutError")
