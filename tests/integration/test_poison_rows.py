"""Rows that PostgreSQL accepts and Python cannot represent, written behind the API's back:
each fails its own job with the reason, and the worker, get_job, list_jobs and the CLI go on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobStatus, Queue
from pgqueue.values import LATEST
from tests.apps import tasks as apps
from tests.conftest import ROOT, settings_worker_process, wait_until

# Run on each server CI tests against: rows the server accepts and Python cannot read.
pytestmark = pytest.mark.each_server

HUGE_INT = "9" * 5000  # valid JSON and jsonb; Python's int() refuses over 4,300 digits


def _insert(conn: psycopg.Connection[Any], schema: str, values: str, params: list[Any]) -> int:
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, max_attempts, run_at, status) VALUES "
        ).format(sql.Identifier(schema))
        + sql.SQL(values)
        + sql.SQL(" RETURNING id"),
        params,
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_unrepresentable_rows_fail_alone_while_the_worker_serves_the_queue(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    runs = tmp_path / "runs"
    runs.mkdir()
    with psycopg.connect(dsn) as conn:
        infinite = _insert(
            conn, schema, "('default', 'record', '{\"i\": 1}', 1, 'infinity', 'scheduled')", []
        )
        far = _insert(
            conn, schema, "('default', 'record', '{\"i\": 2}', 1, '12000-01-01', 'scheduled')", []
        )
        huge = _insert(
            conn,
            schema,
            "('default', 'record', %s::jsonb, 3, now(), 'queued')",
            ['{"i": ' + HUGE_INT + "}"],
        )
        good = [queue.enqueue(apps.record.job(i), conn=conn) for i in range(5)]
        conn.commit()

    # Read back before any worker touched them: nothing raises.
    scheduled = queue.get_job(infinite)
    assert scheduled is not None and scheduled.run_at == LATEST
    assert scheduled.wait_time is None
    listed = {job.id for job in queue.list_jobs(limit=100).jobs}
    assert {infinite, far, huge, *good} <= listed
    unread = queue.get_job(huge)
    assert unread is not None and "unreadable" in unread.args

    log = tmp_path / "worker.log"
    proc = settings_worker_process(
        dsn, schema, {"rescue_interval": 0.2}, log=log, env={"PGQUEUE_TEST_RUNS": str(runs)}
    )
    try:

        def finished(job_id: int) -> bool:
            job = queue.get_job(job_id)
            return job is not None and job.finished

        wait_until(lambda: all(finished(i) for i in (infinite, far, huge, *good)), what="all")
        assert proc.poll() is None, log.read_text()  # still serving
        later = queue.enqueue(apps.record.job(99))
        wait_until(lambda: finished(later), what="a job enqueued after the bad rows")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    assert sorted(i for _, i in apps.read_runs(runs)) == ["0", "1", "2", "3", "4", "99"]
    for job_id in (infinite, far):
        job = queue.get_job(job_id)
        assert job is not None and job.status == JobStatus.FAILED
        assert "after year 9999" in (job.last_error or "")
    bad_args = queue.get_job(huge)
    assert bad_args is not None and bad_args.status == JobStatus.FAILED
    assert bad_args.attempt == 1  # unreadable arguments are not retried
    assert "stored arguments cannot be read" in (bad_args.last_error or "")

    # The command line reads them too.
    for argv in (["jobs", "list"], ["jobs", "show", str(infinite)], ["jobs", "show", str(huge)]):
        shown = subprocess.run(
            [sys.executable, "-m", "pgqueue", *argv, "--dsn", dsn, "--schema", schema, "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)
    queue.close()
