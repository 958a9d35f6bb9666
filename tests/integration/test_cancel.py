"""Cancellation: queued jobs at once, running ones through their worker, recorded in history."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import (
    Cancellation,
    JobContext,
    JobNotFoundError,
    JobStateError,
    Queue,
    Worker,
)
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params
from pgqueue.testing import drain
from tests.apps import tasks as apps
from tests.conftest import (
    claim_params,
    settings_worker_process,
    wait_until,
    worker_in_thread,
    worker_process,
)


def test_a_queued_job_is_cancelled_at_once_and_never_runs(queue: Queue) -> None:
    ran: list[int] = []
    t = queue.task(name="t")(lambda i: ran.append(i))
    job_id = t.enqueue(1)
    assert queue.cancel_job(job_id) is Cancellation.CANCELLED
    drain(queue)
    assert ran == []
    job = queue.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.finished_at is not None
    assert job.attempt == 0 and job.started_at is None


def test_a_scheduled_job_is_cancelled_at_once(queue: Queue) -> None:
    t = queue.task(name="t")(lambda: None)
    job_id = t.with_options(delay=3600).enqueue()
    assert queue.get_job(job_id).status == "scheduled"  # type: ignore[union-attr]
    assert queue.cancel_job(job_id) is Cancellation.CANCELLED
    assert queue.get_job(job_id).status == "cancelled"  # type: ignore[union-attr]


def test_cancelling_a_finished_job_changes_nothing_and_an_unknown_id_is_an_error(
    queue: Queue,
) -> None:
    t = queue.task(name="t")(lambda: 1)
    job_id = t.enqueue()
    drain(queue)
    assert queue.cancel_job(job_id) is Cancellation.FINISHED
    assert queue.get_job(job_id).status == "succeeded"  # type: ignore[union-attr]
    with pytest.raises(JobNotFoundError, match="123456789"):
        queue.cancel_job(123456789)


def test_cancel_inside_the_callers_transaction_follows_it(queue: Queue, dsn: str) -> None:
    t = queue.task(name="t")(lambda: None)
    job_id = t.enqueue()
    with psycopg.connect(dsn) as conn:
        assert queue.cancel_job(job_id, conn=conn) is Cancellation.CANCELLED
        conn.rollback()
    assert queue.get_job(job_id).status == "queued"  # type: ignore[union-attr]


def _wait_for_status(queue: Queue, job_id: int, status: str) -> Any:
    def reached() -> bool:
        job = queue.get_job(job_id)
        return job is not None and job.status == status

    wait_until(reached, what=f"job {job_id} to be {status}")
    return queue.get_job(job_id)


def _cancel_running(
    dsn: str, schema: str, task: Any, tmp_path: Path, settings: dict[str, Any] | None = None
) -> tuple[Any, list[tuple[int, str]]]:
    """Run `task` in a real worker process, cancel it once it started; return its record
    and what the handler recorded."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    log = tmp_path / "worker.log"
    if settings is None:
        proc = worker_process(dsn, schema, log=log, env=env)
    else:
        proc = settings_worker_process(dsn, schema, settings, log=log, env=env)
    queue = Queue(dsn, schema=schema)
    try:
        job_id = queue.enqueue(task.job())
        wait_until(lambda: (job_id, "start") in apps.read_runs(runs), what="the job to start")
        assert queue.cancel_job(job_id) is Cancellation.REQUESTED
        # Still running with the request recorded, or (a fast worker) already cancelled:
        # history keeps no cancel_requested_at.
        running = queue.get_job(job_id)
        assert running is not None
        assert running.cancel_requested_at is not None or running.status == "cancelled"
        job = _wait_for_status(queue, job_id, "cancelled")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        queue.close()
    assert proc.returncode == 0, log.read_text()[-3000:]
    return job, [run for run in apps.read_runs(runs) if run[0] == job_id]


def test_a_running_async_job_is_cancelled_through_its_worker(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    job, runs = _cancel_running(dsn, schema, apps.acancellable, tmp_path)
    assert [rest for _, rest in runs] == ["start", "cancelled"]
    assert job.attempt == 1 and job.errors[-1]["kind"] == "cancelled"
    assert job.last_error == "cancelled on request"


def test_a_running_sync_job_sees_the_flag_and_ends_cancelled(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    job, runs = _cancel_running(dsn, schema, apps.cancellable, tmp_path)
    assert [rest for _, rest in runs] == ["start", "saw cancel"]
    assert job.status == "cancelled" and job.run_time is not None


def test_without_notifications_the_periodic_check_delivers_the_cancel(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    settings = {"poll_only": True, "rescue_interval": 0.2}
    _job, runs = _cancel_running(dsn, schema, apps.acancellable, tmp_path, settings)
    assert [rest for _, rest in runs] == ["start", "cancelled"]


def test_a_failed_attempt_of_a_job_whose_cancel_was_requested_is_not_retried(
    queue: Queue, dsn: str, schema: str
) -> None:
    """The worker may fail (or the rescuer retry) a job before it hears of the cancel: the
    retry outcome then ends the job as cancelled (job_finish_many)."""
    t = queue.task(name="t")(lambda: None)
    job_id = t.enqueue()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(query("job_claim", schema), claim_params(limit=1, worker_id=999))
        assert queue.cancel_job(job_id) is Cancellation.REQUESTED
        outcome = {
            "id": job_id,
            "attempt": 1,
            "worker_id": 999,
            "status": "retry",
            "error": {"kind": "error", "error": "boom"},
            "retry_in": 0,
        }
        conn.execute(
            query("job_finish_many", schema),
            finish_rows_params([outcome]),
        )
    job = queue.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.attempt == 1


def test_a_running_atomic_job_cannot_be_cancelled_but_a_queued_one_can(
    queue: Queue, dsn: str
) -> None:
    started, release = threading.Event(), threading.Event()

    @queue.task(name="atomic_wait", atomic=True)
    def atomic_wait(ctx: JobContext) -> None:
        started.set()
        release.wait(60)

    running_id = atomic_wait.enqueue()
    worker = Worker(queue, dsn=dsn, poll_interval=0.05, atomic_concurrency=1)
    with worker_in_thread(worker):
        assert started.wait(60)
        queued_id = atomic_wait.enqueue()
        with pytest.raises(JobStateError, match="atomic"):
            queue.cancel_job(running_id)
        assert queue.cancel_job(queued_id) is Cancellation.CANCELLED
        release.set()
        _wait_for_status(queue, running_id, "succeeded")
    assert queue.get_job(queued_id).status == "cancelled"  # type: ignore[union-attr]


def test_a_stopping_worker_that_missed_the_cancel_ends_the_job_cancelled_not_queued(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Poll-only and a far rescue interval: the worker never hears of the request; when it
    stops, the job it puts back would run again, so it ends as cancelled instead."""
    runs = tmp_path / "runs"
    runs.mkdir()
    settings = {"poll_only": True, "rescue_interval": 600, "shutdown_grace": 0}
    log = tmp_path / "worker.log"
    proc = settings_worker_process(
        dsn, schema, settings, log=log, env={"PGQUEUE_TEST_RUNS": str(runs)}
    )
    queue = Queue(dsn, schema=schema)
    try:
        job_id = queue.enqueue(apps.acancellable.job())
        wait_until(lambda: (job_id, "start") in apps.read_runs(runs), what="the job to start")
        assert queue.cancel_job(job_id) is Cancellation.REQUESTED
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        job = queue.get_job(job_id)
    finally:
        if proc.poll() is None:
            proc.kill()
        queue.close()
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert job is not None and job.status == "cancelled", job
    assert (job_id, "cancelled") in apps.read_runs(runs)  # stopped by the shutdown, not us
