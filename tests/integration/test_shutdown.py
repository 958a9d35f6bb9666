"""Stopping a worker process: SIGTERM drains within the grace period, then puts jobs back."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue
from pgqueue.testing import enqueued_jobs
from tests.apps import tasks as apps
from tests.conftest import count, wait_until, worker_process


def _started(runs: Path, n: int) -> bool:
    return sum(1 for _, rest in apps.read_runs(runs) if rest == "start") >= n


def _setup(
    dsn: str, schema: str, tmp_path: Path, task: Any, seconds: float, jobs: int, *args: str
) -> tuple[Any, Path, Path, Queue]:
    runs = tmp_path / "runs"
    runs.mkdir()
    log = tmp_path / "worker.log"
    queue = Queue(dsn, schema=schema)
    queue.enqueue_many([task.job(seconds) for _ in range(jobs)])
    proc = worker_process(
        dsn, schema, "--concurrency", "2", *args, log=log, env={"PGQUEUE_TEST_RUNS": str(runs)}
    )
    wait_until(lambda: _started(runs, 2), what="two jobs to start")
    return proc, runs, log, queue


def test_sigterm_lets_running_jobs_finish_and_leaves_the_rest_queued(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    proc, runs, log, queue = _setup(dsn, schema, tmp_path, apps.sleepy, 0.5, 4)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()
    done = [rest for _, rest in apps.read_runs(runs) if rest == "done"]
    assert len(done) == 2
    with psycopg.connect(dsn) as conn:
        left = enqueued_jobs(conn, queue)
        assert [(j.status, j.attempt) for j in left] == [("queued", 0), ("queued", 0)]
        assert count(conn, schema, "workers") == 0
        assert count(conn, schema, "job_history", "status = 'succeeded'") == 2


@pytest.mark.parametrize("task", [apps.sleepy, apps.asleepy], ids=["def", "async def"])
def test_jobs_still_running_after_the_grace_period_are_put_back_unspent(
    dsn: str, schema: str, tmp_path: Path, task: Any
) -> None:
    proc, _runs, log, queue = _setup(dsn, schema, tmp_path, task, 60, 3, "--shutdown-grace", "0.2")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()
    assert "put 2 unfinished jobs back" in log.read_text()
    with psycopg.connect(dsn) as conn:
        left = enqueued_jobs(conn, queue)
        assert sorted((j.status, j.attempt) for j in left) == [("queued", 0)] * 3
        assert count(conn, schema, "workers") == 0


def test_second_signal_stops_at_once_and_puts_jobs_back(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    proc, _runs, log, queue = _setup(dsn, schema, tmp_path, apps.asleepy, 60, 2)
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "signal again to stop now" in log.read_text(), what="first signal")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0, log.read_text()
    with psycopg.connect(dsn) as conn:
        assert sorted((j.status, j.attempt) for j in enqueued_jobs(conn, queue)) == [
            ("queued", 0),
            ("queued", 0),
        ]
