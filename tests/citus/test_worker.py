"""Citus workers as an operator runs them: `pgqueue worker` processes given the coordinator's
DSN, claiming shard by shard. Every job runs once across two workers and both nodes; each
claim is one task on its shard's node; retries, pauses, a graceful stop and a kill -9 lose
nothing."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue.citus import CitusQueue, CitusWorker
from pgqueue.errors import CitusUnsupportedError
from pgqueue.store.citus import claim_statement
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.citus import app
from tests.citus.conftest import values_on_two_nodes
from tests.conftest import wait_until, worker_process

pytestmark = pytest.mark.citus

TENANTS = [f"tenant-{i}" for i in range(12)]


def _in_process(coordinator: str, schema: str) -> CitusWorker:
    """A burst worker of the app's tasks, run here."""
    return CitusWorker(app.queue, dsn=coordinator, schema=schema, burst=True, poll_interval=0.05)


def _worker(coordinator: str, schema: str, log: Path, *args: str) -> Any:
    env = {"CITUS_APP_DSN": coordinator, "CITUS_APP_SCHEMA": schema}
    return worker_process(
        coordinator, schema, "--poll-interval", "0.1", "--heartbeat-interval", "0.5", *args,
        log=log, env=env, app="tests.citus.app:queue",
    )  # fmt: skip


def _scalar(conn: psycopg.Connection[Any], query: str, schema: str) -> Any:
    row = conn.execute(sql.SQL(query).format(schema=sql.Identifier(schema))).fetchone()
    assert row is not None
    return row[0]


def _stop(process: Any) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def test_a_claim_names_its_shard_and_runs_as_one_task_on_its_node(
    coordinator: str, citus_schema: str
) -> None:
    params = {"shard": "acme", "queues": ["default"], "limit": 10, "worker_id": 1}
    with psycopg.connect(coordinator) as conn:
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                sql.SQL("EXPLAIN ") + claim_statement(citus_schema), params
            ).fetchall()
        )
        conn.rollback()
    assert "Task Count: 1" in plan, plan
    assert re.search(r"LockRows", plan), plan


@pytest.mark.parametrize("claims", ["nodes", "coordinator"])
def test_two_worker_processes_run_every_job_once_across_both_nodes(
    coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path, claims: str
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as conn:
        first, second = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        tenants = list(dict.fromkeys([first, second, *TENANTS]))
        jobs = [app.record.job(tenant_id=t, n=i) for i in range(10) for t in tenants]
        queue.enqueue_many(jobs)
        workers = [
            _worker(coordinator, citus_schema, tmp_path / f"w{i}.log", "--citus-claims", claims)
            for i in range(2)
        ]
        try:
            wait_until(
                lambda: (
                    _scalar(conn, "SELECT count(*) FROM {schema}.runs", citus_schema) >= len(jobs)
                ),
                what="every job to run",
            )
        finally:
            for worker in workers:
                _stop(worker)
        runs = conn.execute(
            sql.SQL("SELECT tenant_id, n, count(*) FROM {}.runs GROUP BY 1, 2").format(
                sql.Identifier(citus_schema)
            )
        ).fetchall()
        assert len(runs) == len(jobs) and all(row[2] == 1 for row in runs)
        assert _scalar(conn, "SELECT count(*) FROM {schema}.jobs", citus_schema) == 0
        succeeded = "SELECT count(*) FROM {schema}.job_history WHERE status = 'succeeded'"
        assert _scalar(conn, succeeded, citus_schema) == len(jobs)
        pids = "SELECT count(DISTINCT pid) FROM {schema}.runs"
        assert _scalar(conn, pids, citus_schema) == 2


def test_a_failing_job_is_retried_then_fails_with_its_errors_in_history(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    job_id = queue.enqueue_many([app.fail.job(tenant_id="acme")])[0]

    def failed() -> bool:
        # A burst worker ends while the retry is scheduled ahead: run another until it failed.
        asyncio.run(_in_process(coordinator, citus_schema).run_async())
        job = queue.get_job(job_id)
        return job is not None and job.status == "failed"

    wait_until(failed, timeout=30, what="the second attempt to fail")
    job = queue.get_job(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 2
    assert len(job.errors) == 2 and "no luck for acme" in job.errors[-1]["error"]


def test_a_paused_queue_is_not_claimed_until_resumed(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    queue.enqueue_many([app.record.job(tenant_id="acme", n=1)])
    assert queue.pause_queue("default") == ["default"]
    assert [p.queue for p in queue.paused_queues()] == ["default"]
    paused = _in_process(coordinator, citus_schema)
    asyncio.run(paused.run_async())
    assert paused.claimed == 0
    assert queue.resume_queue("default") == ["default"]
    resumed = _in_process(coordinator, citus_schema)
    asyncio.run(resumed.run_async())
    assert resumed.claimed == 1


def test_a_stopped_worker_puts_its_running_jobs_back_unspent(
    coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path
) -> None:
    queue.enqueue_many([app.record.job(tenant_id="acme", n=1, sleep=30)])
    running = "SELECT count(*) FROM {schema}.jobs WHERE status = 'running'"
    with psycopg.connect(coordinator, autocommit=True) as conn:
        worker = _worker(coordinator, citus_schema, tmp_path / "w.log", "--shutdown-grace", "0.2")
        wait_until(lambda: _scalar(conn, running, citus_schema) == 1, what="the job to start")
        _stop(worker)
        back = "SELECT status, attempt FROM {schema}.jobs"
        row = conn.execute(sql.SQL(back).format(schema=sql.Identifier(citus_schema))).fetchone()
        assert row == ("queued", 0)


def test_jobs_of_a_worker_killed_by_sigkill_are_rescued_and_run(
    coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path
) -> None:
    jobs = [app.record.job(tenant_id=t, n=1, sleep=2) for t in TENANTS[:4]]
    queue.enqueue_many(jobs)
    running = "SELECT count(*) FROM {schema}.jobs WHERE status = 'running'"
    with psycopg.connect(coordinator, autocommit=True) as conn:
        doomed = _worker(coordinator, citus_schema, tmp_path / "doomed.log")
        wait_until(lambda: _scalar(conn, running, citus_schema) == 4, what="the jobs to start")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)
        rescuer = _worker(
            coordinator, citus_schema, tmp_path / "rescuer.log",
            "--lease-timeout", "2", "--rescue-interval", "0.5",
        )  # fmt: skip
        try:
            done = "SELECT count(*) FROM {schema}.job_history WHERE status = 'succeeded'"
            wait_until(lambda: _scalar(conn, done, citus_schema) == 4, what="the rescued jobs")
        finally:
            _stop(rescuer)
        attempts = "SELECT array_agg(attempt ORDER BY attempt) FROM {schema}.job_history"
        assert _scalar(conn, attempts, citus_schema) == [2, 2, 2, 2]
        assert _scalar(conn, "SELECT count(*) FROM {schema}.jobs", citus_schema) == 0


def test_a_citus_worker_refuses_atomic_tasks(queue: CitusQueue) -> None:
    @queue.task(name="citus.atomic", atomic=True)
    def atomic() -> None: ...

    with pytest.raises(CitusUnsupportedError, match=r"citus\.atomic"):
        CitusWorker(queue)


def test_a_job_lost_on_its_last_attempt_fails_as_lost(
    coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path
) -> None:
    job_id = queue.enqueue_many(
        [app.record.with_options(max_attempts=1).job(tenant_id="acme", n=1, sleep=30)]
    )[0]
    running = "SELECT count(*) FROM {schema}.jobs WHERE status = 'running'"
    with psycopg.connect(coordinator, autocommit=True) as conn:
        doomed = _worker(coordinator, citus_schema, tmp_path / "doomed.log")
        wait_until(lambda: _scalar(conn, running, citus_schema) == 1, what="the job to start")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)
    rescuer = _in_process(coordinator, citus_schema)
    rescuer.settings = rescuer.settings.model_copy(
        update={"lease_timeout": timedelta(seconds=1), "rescue_interval": timedelta(seconds=0.2)}
    )
    wait_until(lambda: _lost(coordinator, citus_schema), timeout=30, what="the heartbeat to age")
    asyncio.run(rescuer.run_async())
    job = queue.get_job(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 1
    assert job.errors[-1]["kind"] == "lost"


def _lost(coordinator: str, schema: str) -> bool:
    old = "SELECT count(*) FROM {schema}.workers WHERE heartbeat_at < now() - interval '1 second'"
    with psycopg.connect(coordinator) as conn:
        return bool(_scalar(conn, old, schema))


def test_a_citus_worker_refuses_a_metrics_port(coordinator: str, citus_schema: str) -> None:
    env = {"CITUS_APP_DSN": coordinator, "CITUS_APP_SCHEMA": citus_schema}
    done = run_pgqueue(
        "worker", "tests.citus.app:queue", "--dsn", coordinator, "--metrics-port", "9", env=env
    )
    assert_usage_error(done, "--metrics-port is not available for a Citus worker")


def test_processes_2_runs_two_citus_workers_under_one_supervisor(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    jobs = [app.record.job(tenant_id=t, n=i) for i in range(5) for t in TENANTS]
    queue.enqueue_many(jobs)
    env = {"CITUS_APP_DSN": coordinator, "CITUS_APP_SCHEMA": citus_schema}
    done = run_pgqueue(
        "worker", "tests.citus.app:queue", "--dsn", coordinator, "--schema", citus_schema,
        "--processes", "2", "--burst", "--poll-interval", "0.1", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with psycopg.connect(coordinator) as conn:
        assert _scalar(conn, "SELECT count(*) FROM {schema}.runs", citus_schema) == len(jobs)
        assert _scalar(conn, "SELECT count(*) FROM {schema}.jobs", citus_schema) == 0


def test_a_node_restarted_fast_under_a_worker_loses_no_job_and_runs_none_twice(
    citus: Any, coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as conn:
        first, second = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        tenants = list(dict.fromkeys([first, second, *TENANTS]))
        jobs = [app.record.job(tenant_id=t, n=i, sleep=0.05) for i in range(8) for t in tenants]
        queue.enqueue_many(jobs)
        worker = _worker(coordinator, citus_schema, tmp_path / "w.log", "--concurrency", "4")
        ran = "SELECT count(*) FROM {schema}.runs"
        try:
            wait_until(lambda: _scalar(conn, ran, citus_schema) >= 10, what="jobs to run")
            citus.restart(1)
            wait_until(
                lambda: _scalar(conn, "SELECT count(*) FROM {schema}.jobs", citus_schema) == 0,
                timeout=120,
                what="every job to finish after the restart",
            )
        finally:
            _stop(worker)
        twice = (
            "SELECT count(*) FROM (SELECT 1 FROM {schema}.runs GROUP BY tenant_id, n"
            " HAVING count(*) > 1) AS d"
        )
        assert _scalar(conn, ran, citus_schema) == len(jobs)
        assert _scalar(conn, twice, citus_schema) == 0
        done = "SELECT count(*) FROM {schema}.job_history WHERE status = 'succeeded'"
        assert _scalar(conn, done, citus_schema) == len(jobs)


def test_a_worker_follows_a_shard_moved_to_the_other_node(
    coordinator: str, citus_schema: str, queue: CitusQueue, tmp_path: Path
) -> None:
    """Its claims went to the shard's table on the old node; once the table is gone there,
    the worker reads the placements again and claims on the new node."""
    first = app.record.job(tenant_id="acme", n=1)
    queue.enqueue_many([first])
    ran = "SELECT count(*) FROM {schema}.runs"
    with psycopg.connect(coordinator, autocommit=True) as conn:
        worker = _worker(coordinator, citus_schema, tmp_path / "w.log")
        try:
            wait_until(lambda: _scalar(conn, ran, citus_schema) == 1, what="the first job")
            row = conn.execute(
                "SELECT p.shardid, p.nodeport, n.nodeport FROM pg_dist_shard_placement AS p"
                " JOIN pg_dist_node AS n ON n.nodeport <> p.nodeport AND n.groupid > 0"
                " WHERE p.shardid = get_shard_id_for_distribution_column(%s::regclass, 'acme')",
                [f"{citus_schema}.jobs"],
            ).fetchone()
            assert row is not None
            shard, old, new = row
            conn.execute(
                "SELECT citus_move_shard_placement(%s, '127.0.0.1', %s, '127.0.0.1', %s,"
                " shard_transfer_mode => 'block_writes')",
                [shard, old, new],
            )
            conn.execute("CALL citus_cleanup_orphaned_resources()")  # the old tables go now
            queue.enqueue_many([app.record.job(tenant_id="acme", n=n) for n in range(2, 12)])
            wait_until(lambda: _scalar(conn, ran, citus_schema) == 11, what="the moved jobs")
        finally:
            _stop(worker)
        assert "is no longer on 127.0.0.1:" in (tmp_path / "w.log").read_text()
        twice = "SELECT count(*) - count(DISTINCT n) FROM {schema}.runs"
        assert _scalar(conn, twice, citus_schema) == 0
