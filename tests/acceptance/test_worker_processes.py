"""`pgqueue worker --processes N` as an operator runs it: one supervisor process, N real
worker processes under it, a real PostgreSQL.

The workers share the jobs; one metrics port sums them, and keeps what a dead worker counted;
SIGTERM to the supervisor stops every worker gracefully; a killed worker is started again; if
the supervisor dies its workers stop; each line says which worker wrote it.
"""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from pgqueue import Queue
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.apps import tasks as apps
from tests.conftest import count, free_port, wait_until, worker_process


def _supervisor(dsn: str, schema: str, tmp_path: Path, *args: str) -> Any:
    """`pgqueue worker --processes 2` with quick heartbeats; output in tmp_path/out.log and
    jobs' runs recorded in tmp_path/runs."""
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    return worker_process(
        dsn, schema, "--processes", "2", "--poll-interval", "0.2", "--heartbeat-interval", "1",
        *args, log=tmp_path / "out.log", env={"PGQUEUE_TEST_RUNS": str(runs)},
    )  # fmt: skip


def _worker_pids(conn: psycopg.Connection[Any], schema: str) -> set[int]:
    query = sql.SQL("SELECT pid FROM {}.workers").format(sql.Identifier(schema))
    return {int(row[0]) for row in conn.execute(query)}


def _finished(port: int) -> float | None:
    """The jobs finished by all workers, as the one metrics endpoint sums them; None while it
    does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
            text = page.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "pgqueue_jobs_finished_total"
    )


def _stop(proc: Any) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return int(proc.wait(timeout=90))


def test_two_worker_processes_share_the_jobs_and_one_port_sums_their_metrics(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    port = free_port()
    proc = _supervisor(dsn, schema, tmp_path, "--concurrency", "1", "--metrics-port", str(port))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: count(conn, schema, "workers") == 2, what="two workers")
            children = _worker_pids(conn, schema)
            Queue(dsn, schema=schema).enqueue_many([apps.sleepy.job(0.3) for _ in range(6)])
            wait_until(lambda: count(conn, schema, "job_history") == 6, what="the six jobs")
        wait_until(lambda: _finished(port) == 6, what="the endpoint counting six jobs")
    finally:
        code = _stop(proc)
    out = (tmp_path / "out.log").read_text()
    assert code == 0, out[-3000:]
    ran_in = {int(p.stem.removeprefix("runs-")) for p in (tmp_path / "runs").glob("runs-*")}
    assert ran_in == children and proc.pid not in children
    assert "[worker 1/2] " in out and "[worker 2/2] " in out
    assert "Traceback" not in out, out[-3000:]


def test_sigterm_to_the_supervisor_lets_each_workers_running_job_finish(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    proc = _supervisor(dsn, schema, tmp_path, "--concurrency", "1")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: count(conn, schema, "workers") == 2, what="two workers")
            Queue(dsn, schema=schema).enqueue_many([apps.sleepy.job(2.0) for _ in range(2)])
            runs = tmp_path / "runs"
            wait_until(
                lambda: [r for _, r in apps.read_runs(runs)].count("start") == 2,
                what="both jobs running, one in each worker",
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, (tmp_path / "out.log").read_text()[-3000:]
            assert count(conn, schema, "job_history", "status = 'succeeded'") == 2
            assert count(conn, schema, "workers") == 0
    finally:
        _stop(proc)
    assert "received SIGTERM: stopping the workers" in (tmp_path / "out.log").read_text()


def test_a_second_sigterm_stops_the_workers_at_once_putting_their_jobs_back(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    proc = _supervisor(dsn, schema, tmp_path, "--concurrency", "1")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: count(conn, schema, "workers") == 2, what="two workers")
            Queue(dsn, schema=schema).enqueue_many([apps.asleepy.job(600.0) for _ in range(2)])
            wait_until(
                lambda: count(conn, schema, "jobs", "status = 'running'") == 2,
                what="both jobs running, one in each worker",
            )
            proc.send_signal(signal.SIGTERM)
            wait_until(
                lambda: (
                    "received SIGTERM: stopping the workers," in (tmp_path / "out.log").read_text()
                ),
                what="the first signal passed on",
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, (tmp_path / "out.log").read_text()[-3000:]
            assert count(conn, schema, "jobs", "status = 'queued'") == 2
    finally:
        _stop(proc)


def test_sigterm_while_the_workers_start_exits_0(dsn: str, schema: str, tmp_path: Path) -> None:
    proc = _supervisor(dsn, schema, tmp_path)
    try:
        wait_until(
            lambda: "worker 2/2 started" in (tmp_path / "out.log").read_text(),
            what="both worker processes started",
        )
        proc.send_signal(signal.SIGTERM)  # before or after they could handle it: a stop
        assert proc.wait(timeout=60) == 0, (tmp_path / "out.log").read_text()[-3000:]
    finally:
        _stop(proc)


def test_a_killed_worker_is_restarted_and_the_port_keeps_what_it_counted(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    port = free_port()
    proc = _supervisor(dsn, schema, tmp_path, "--metrics-port", str(port))
    queue = Queue(dsn, schema=schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: count(conn, schema, "workers") == 2, what="two workers")
            queue.enqueue_many([apps.record.job(i) for i in range(20)])
            wait_until(lambda: _finished(port) == 20, what="the endpoint counting 20 jobs")
            first = _worker_pids(conn, schema)
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            wait_until(
                lambda: len(_worker_pids(conn, schema) - first) == 1,
                what="the killed worker started again",
            )
            queue.enqueue_many([apps.record.job(i) for i in range(20, 30)])
            wait_until(lambda: count(conn, schema, "job_history") == 30, what="30 jobs")
        wait_until(lambda: _finished(port) == 30, what="the endpoint counting 30 jobs")
    finally:
        code = _stop(proc)
    out = (tmp_path / "out.log").read_text()
    assert code == 0, out[-3000:]
    assert f"(pid {victim}) ended unexpectedly" in out and "killed by SIGKILL" in out, out


def test_workers_whose_supervisor_is_killed_stop(dsn: str, schema: str, tmp_path: Path) -> None:
    proc = _supervisor(dsn, schema, tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        wait_until(lambda: count(conn, schema, "workers") == 2, what="two workers")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(lambda: count(conn, schema, "workers") == 0, what="both workers stopped")
    assert "the supervisor is gone" in (tmp_path / "out.log").read_text()


def test_burst_with_two_processes_exits_0_once_both_are_done(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    Queue(dsn, schema=schema).enqueue_many([apps.record.job(i) for i in range(10)])
    proc = _supervisor(dsn, schema, tmp_path, "--burst")
    assert proc.wait(timeout=90) == 0, (tmp_path / "out.log").read_text()[-3000:]
    assert len(apps.read_runs(tmp_path / "runs")) == 10


def test_burst_exits_1_when_a_worker_failed(dsn: str, schema: str, tmp_path: Path) -> None:
    Queue(dsn, schema=schema).enqueue_many([apps.asleepy.job(60.0)])
    proc = _supervisor(dsn, schema, tmp_path, "--burst", "--concurrency", "1")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            query = sql.SQL(
                "SELECT w.pid FROM {s}.jobs AS j JOIN {s}.workers AS w ON w.id = j.worker_id"
            ).format(s=sql.Identifier(schema))
            wait_until(lambda: conn.execute(query).fetchone() is not None, what="the job running")
            row = conn.execute(query).fetchone()
            assert row is not None
            os.kill(int(row[0]), signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    finally:
        _stop(proc)
    assert "killed by SIGKILL" in (tmp_path / "out.log").read_text()


@pytest.mark.parametrize("value", ["0", "abc"])
def test_processes_other_than_a_positive_number_or_auto_exits_2(value: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--processes", value)
    assert_usage_error(result, f"argument --processes: {value!r} is not a number of processes")


def test_processes_auto_starts_one_worker_per_core(dsn: str, schema: str) -> None:
    cores = getattr(os, "process_cpu_count", os.cpu_count)() or 1
    result = run_pgqueue(
        "worker", "tests.apps.tasks:queue", "--dsn", dsn, "--schema", schema,
        "--processes", "auto", "--burst",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = f"--processes auto: {cores} worker process{'es' if cores > 1 else ''}"
    assert said in result.stderr
    if cores > 1:
        assert f"[worker {cores}/{cores}] " in result.stderr
