"""Retry: a failed or cancelled job runs again as a new job that links to the original."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pgqueue import (
    Enqueued,
    JobNotFoundError,
    JobStateError,
    Queue,
    RetryPolicy,
    Worker,
)
from pgqueue.testing import drain
from tests.conftest import wait_until, worker_in_thread


@pytest.fixture
def flaky(queue: Queue) -> Any:
    """Fails while `broken` holds True."""
    state = {"broken": True}

    @queue.task(name="flaky", queue="q", priority=5, max_attempts=2, retry=RetryPolicy(base=0))
    def flaky(n: int) -> int:
        if state["broken"]:
            raise RuntimeError("still broken")
        return n

    flaky.state = state  # type: ignore[attr-defined]
    return flaky


def test_a_failed_job_is_retried_with_a_fresh_attempt_count_and_a_link(
    queue: Queue, flaky: Any
) -> None:
    original = flaky.enqueue(7)
    drain(queue, queues=["q"])
    assert queue.get_job(original).status == "failed"  # type: ignore[union-attr]
    flaky.state["broken"] = False
    retry = queue.retry_job(original)
    assert isinstance(retry, Enqueued) and retry != original
    fresh = queue.get_job(retry)
    assert fresh is not None and fresh.status == "queued" and fresh.attempt == 0
    assert fresh.retry_of == original and fresh.args == {"n": 7}
    assert (fresh.queue, fresh.priority, fresh.max_attempts) == ("q", 5, 2)
    drain(queue, queues=["q"])
    done = queue.get_job(retry)
    assert done is not None and done.status == "succeeded" and done.result == 7
    assert done.retry_of == original
    assert queue.get_job(original).status == "failed"  # type: ignore[union-attr]


def test_a_cancelled_job_can_be_retried(queue: Queue) -> None:
    t = queue.task(name="t")(lambda: None)
    job_id = t.enqueue()
    queue.cancel_job(job_id)
    retry = queue.retry_job(job_id)
    assert queue.get_job(retry).retry_of == job_id  # type: ignore[union-attr]


def test_only_failed_or_cancelled_jobs_can_be_retried(queue: Queue) -> None:
    t = queue.task(name="t")(lambda: None)
    done = t.enqueue()
    drain(queue)
    live = t.enqueue()
    with pytest.raises(JobStateError, match="succeeded"):
        queue.retry_job(done)
    with pytest.raises(JobStateError, match="queued"):
        queue.retry_job(live)
    with pytest.raises(JobNotFoundError):
        queue.retry_job(424242424)


def test_a_second_retry_while_the_first_is_live_is_refused_naming_it(
    queue: Queue, flaky: Any
) -> None:
    original = flaky.enqueue(1)
    drain(queue, queues=["q"])
    first = queue.retry_job(original)
    with pytest.raises(JobStateError, match=f"as job {first}"):
        queue.retry_job(original)


def test_two_retries_racing_in_open_transactions_make_one_job(
    queue: Queue, flaky: Any, dsn: str, schema: str
) -> None:
    original = flaky.enqueue(1)
    drain(queue, queues=["q"])
    errors: list[Exception] = []
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        queue.retry_job(original, conn=first)

        def race() -> None:
            try:
                queue.retry_job(original, conn=second)
            except JobStateError as exc:
                errors.append(exc)

        racer = threading.Thread(target=race)
        racer.start()
        with psycopg.connect(dsn, autocommit=True) as probe:
            pid = second.info.backend_pid

            def waiting() -> bool:
                row = probe.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()
                return row is not None and row[0] == "Lock"

            wait_until(waiting, what="the second retry to wait on the first")
        first.commit()
        racer.join(timeout=60)
        second.rollback()
    assert len(errors) == 1 and "already being retried" in str(errors[0])
    page = queue.list_jobs(queue="q", status="queued")
    assert [job.retry_of for job in page.jobs] == [original]


def test_a_retry_wakes_a_listening_worker(queue: Queue, flaky: Any, dsn: str) -> None:
    """Through job_insert, so its NOTIFY wakes the worker long before its next poll."""
    original = flaky.enqueue(1)
    drain(queue, queues=["q"])
    flaky.state["broken"] = False
    worker = Worker(queue, dsn=dsn, queues=["q"], poll_interval=600)
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims > 0, what="the worker's first claim")
        retry = queue.retry_job(original)

        def done() -> bool:
            job = queue.get_job(retry)
            return job is not None and job.status == "succeeded"

        wait_until(done, timeout=30, what="the retried job to run")


def test_a_retry_of_an_atomic_job_is_atomic(queue: Queue) -> None:
    t = queue.task(name="a", atomic=True)(lambda: None)
    job_id = t.enqueue()
    queue.cancel_job(job_id)
    retry = queue.retry_job(job_id)
    assert queue.get_job(retry).atomic  # type: ignore[union-attr]
