"""Several real worker processes share a queue: every job runs exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import clean_exit_logs, count, stop_worker_processes, wait_until, worker_process

JOBS = 5_000
WORKERS = 4


def test_5000_jobs_by_4_worker_processes_each_run_exactly_once(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    procs = [worker_process(dsn, schema, "--concurrency", "8", log=log, env=env) for log in logs]
    try:
        with psycopg.connect(dsn) as conn:
            wait_until(lambda: count(conn, schema, "workers") == WORKERS, what="4 workers")
            conn.commit()
            queue = Queue(dsn, schema=schema)
            for start in range(0, JOBS, 500):
                half = [apps.record.job(i) for i in range(start, start + 250)]
                half += [apps.arecord.job(i) for i in range(start + 250, start + 500)]
                queue.enqueue_many(half, conn=conn)
                conn.commit()

            def finished() -> bool:
                done = count(conn, schema, "job_history")
                conn.commit()
                return done == JOBS

            wait_until(finished, timeout=120, what=f"{JOBS} finished jobs")
            statuses = conn.execute(
                f'SELECT status, count(*) FROM "{schema}".job_history GROUP BY 1'
            ).fetchall()
            assert statuses == [("succeeded", JOBS)]
            assert count(conn, schema, "jobs") == 0
    finally:
        stop_worker_processes(procs)

    clean_exit_logs(procs, logs)
    recorded = apps.read_runs(runs)
    per_job: Counter[Any] = Counter(rest for _, rest in recorded)
    assert len(recorded) == JOBS
    assert set(per_job) == {str(i) for i in range(JOBS)}
    assert max(per_job.values()) == 1
    pids = {path.name for path in runs.glob("runs-*.txt")}
    assert len(pids) == WORKERS, f"only {len(pids)} of {WORKERS} processes ran jobs"
