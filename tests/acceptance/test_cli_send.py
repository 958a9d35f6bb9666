"""`pgqueue enqueue` and `pgqueue signal` as a user's shell runs them: real processes (the
command, and a worker of tests/apps/tasks.py), a real PostgreSQL.

A job enqueued from the shell passes queue.enqueue's checks, against the app's task with
--app; a bad one is exit 2 and stores nothing. --wait prints the result a worker computed, or
exits 1 saying how the job ended. A signal from the shell wakes the job parked for its key.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.apps import tasks as apps
from tests.conftest import (
    ROOT,
    count,
    env_without_dsn,
    stop_worker_processes,
    wait_until,
    worker_process,
)

APP = "tests.apps.tasks:queue"


@pytest.fixture
def worker(dsn: str, schema: str, tmp_path: Path) -> Iterator[Any]:
    """A worker of tests/apps/tasks.py as a real process, stopped after the test."""
    proc = worker_process(dsn, schema, log=tmp_path / "worker.log")
    yield proc
    stop_worker_processes([proc])


def enqueue(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_pgqueue("enqueue", *args, "--dsn", dsn, "--schema", schema)


def jobs(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        return count(conn, schema, "jobs")


# -- enqueue -------------------------------------------------------------------------------------


def test_enqueue_wait_prints_the_id_then_the_result_a_worker_process_computed(
    dsn: str, schema: str, worker: Any
) -> None:
    done = enqueue(dsn, schema, "add", "--args", "[2, 3]", "--app", APP, "--wait", "60")
    assert done.returncode == 0, done.stderr
    job_id, result = done.stdout.splitlines()
    assert json.loads(result) == {"sum": 5}
    queue = Queue(dsn, schema=schema)
    job = queue.get_job(int(job_id))
    queue.close()
    assert job is not None and job.status == "succeeded" and job.args == {"x": 2, "y": 3}


def test_enqueue_wait_of_a_job_that_fails_exits_1_with_its_error(
    dsn: str, schema: str, worker: Any
) -> None:
    done = enqueue(
        dsn, schema, "always_fails", "--args", '{"note": "the dishes"}', "--app", APP, "--wait"
    )
    assert done.returncode == 1, done.stderr
    job_id = done.stdout.strip()
    assert f"pgqueue: error: job {job_id} failed: ValueError: cannot do the dishes" in done.stderr
    assert "Traceback" not in done.stderr


def test_enqueue_wait_of_a_job_cancelled_meanwhile_exits_1_saying_so(dsn: str, schema: str) -> None:
    command = [sys.executable, "-m", "pgqueue", "enqueue", "noop", "--delay", "1h", "--wait"]
    waiting = subprocess.Popen(
        [*command, "--dsn", dsn, "--schema", schema],
        cwd=ROOT,
        env=env_without_dsn(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiting.stdout is not None
    job_id = int(waiting.stdout.readline())  # printed, and flushed, before the wait
    queue = Queue(dsn, schema=schema)
    queue.cancel_job(job_id)
    queue.close()
    _, stderr = waiting.communicate(timeout=60)
    assert waiting.returncode == 1, stderr
    assert f"pgqueue: error: job {job_id} was cancelled" in stderr


def test_enqueue_wait_with_a_timeout_exits_1_and_the_job_stays(dsn: str, schema: str) -> None:
    done = enqueue(dsn, schema, "noop", "--delay", "1h", "--wait", "0.2")
    assert done.returncode == 1, done.stderr
    assert "had not finished after 0.2 s" in done.stderr
    assert jobs(dsn, schema) == 1


def test_enqueue_passes_each_option_to_the_job_as_queue_enqueue_does(dsn: str, schema: str) -> None:
    done = enqueue(
        dsn, schema, "reports.build", "--kwargs", '{"month": "2026-11", "pages": [1, 2]}',
        "--queue", "reports", "--priority", "-5", "--run-at", "2030-01-01T09:00:00+00:00",
        "--max-attempts", "3", "--dedupe-key", "report-2026-11", "--concurrency-key",
        "tenant-a", "--tag", "monthly", "--tag", "pdf",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    queue = Queue(dsn, schema=schema)
    job = queue.get_job(int(done.stdout))
    assert job is not None
    assert (job.task, job.queue, job.priority, job.max_attempts, job.status) == (
        "reports.build", "reports", -5, 3, "scheduled"
    )  # fmt: skip
    assert job.args == {"month": "2026-11", "pages": [1, 2]}
    assert job.run_at.isoformat() == "2030-01-01T09:00:00+00:00"
    assert (job.dedupe_key, job.concurrency_key, job.tags) == (
        "report-2026-11", "tenant-a", ["monthly", "pdf"]
    )  # fmt: skip
    again = enqueue(dsn, schema, "reports.build", "--dedupe-key", "report-2026-11")
    assert again.returncode == 0, again.stderr
    assert again.stdout == done.stdout  # the live job's id: nothing new
    assert "already exists; nothing enqueued" in again.stderr
    assert jobs(dsn, schema) == 1
    queue.close()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--args", "{x: 1}"], "argument --args: '{x: 1}' is not JSON"),
        (["--args", "7"], "is a single JSON value: give an array"),
        (["--kwargs", "[1]"], "argument --kwargs: '[1]' is not a JSON object"),
        (["--args", "[1]"], "only the task's signature can name: pass --app"),
        (["--args", '{"x": 1}', "--kwargs", '{"x": 2}'], "'x' is given by --args and by --kwargs"),
        (["--priority", "1000"], "priority=1000: Input should be less than or equal to 100"),
        (["--run-at", "2030-01-01T09:00"], "not an ISO 8601 time with an offset"),
        (["--delay", "5", "--run-at", "2030-01-01T09:00+00:00"], "give delay"),
        (["--dedupe-window", "1h"], "dedupe_window"),
    ],
)
def test_a_bad_enqueue_exits_2_naming_the_problem_and_stores_nothing(
    dsn: str, schema: str, args: list[str], says: str
) -> None:
    done = enqueue(dsn, schema, "noop", *args)
    assert_usage_error(done, says)
    assert jobs(dsn, schema) == 0


@pytest.mark.parametrize(
    ("task", "args", "says"),
    [
        ("add", ["--args", "[2]"], "task 'add': missing a required argument: 'y'"),
        ("add", ["--args", '{"x": 1, "y": 2, "z": 3}'], "got an unexpected keyword argument 'z'"),
        ("add", ["--args", '["two", 3]'], "task 'add': invalid arguments"),
        ("ad", ["--args", "[2, 3]"], "no task is registered under 'ad'"),
    ],
)
def test_with_app_arguments_that_do_not_fit_the_task_exit_2_and_store_nothing(
    dsn: str, schema: str, task: str, args: list[str], says: str
) -> None:
    done = enqueue(dsn, schema, task, *args, "--app", APP)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert jobs(dsn, schema) == 0


# -- signal --------------------------------------------------------------------------------------


def test_signal_wakes_the_job_parked_for_its_key_with_its_payload(
    dsn: str, schema: str, worker: Any
) -> None:
    queue = Queue(dsn, schema=schema)
    job_id = queue.enqueue(apps.await_signal.job("order-7-approval"))
    # Parked once its wait is recorded: scheduled again, holding no slot.
    wait_until(lambda: _waiting_for(queue, job_id) == "order-7-approval", what="the job to park")
    done = run_pgqueue(
        "signal", "order-7-approval", "--payload", '{"ok": true}', "--dsn", dsn,
        "--schema", schema,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0  # the signal's id
    assert queue.wait(job_id, timeout=60) == {"ok": True}
    queue.close()


def _waiting_for(queue: Queue, job_id: int) -> str | None:
    return queue.job_steps(job_id).waiting_for


def test_a_bad_signal_exits_2_and_stores_nothing(dsn: str, schema: str) -> None:
    for args, says in (
        (["k", "--payload", "{"], "argument --payload: '{' is not JSON"),
        (["", "--payload", "1"], "a signal key is a non-empty string"),
    ):
        done = run_pgqueue("signal", *args, "--dsn", dsn, "--schema", schema)
        assert_usage_error(done, says)
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "signals") == 0
