"""Several real worker processes never let a concurrency key exceed its limit.

Handlers record their start and end (one monotonic clock for all processes) in O_APPEND
files. A job's recorded interval lies inside the time it held its slot, so the most jobs of
one key seen running at once can only under-count, never over-count, what the database let
in: if it exceeds the limit, the claim let too many in.
"""

from __future__ import annotations

import argparse
import signal
from collections import Counter, defaultdict
from pathlib import Path

import psycopg
import pytest

from bench.tenants import overadmit
from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import count, wait_until, worker_process

WORKERS = 4
KEYS = 30
JOBS = 1500


def _limit(k: int) -> int | None:
    """Keys 0..19 have their own limit 1..4; keys 20..29 take the default (2)."""
    return 1 + k % 4 if k < 20 else None


def test_worker_processes_never_run_more_jobs_of_a_key_than_its_limit(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    queue.set_concurrency_limit(None, 2)
    limits = {f"k{k}": _limit(k) or 2 for k in range(KEYS)}
    for k in range(20):
        queue.set_concurrency_limit(f"k{k}", _limit(k))
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
    procs = [worker_process(dsn, schema, "--concurrency", "8", log=log, env=env) for log in logs]
    try:
        with psycopg.connect(dsn) as conn:
            wait_until(lambda: count(conn, schema, "workers") == WORKERS, what="the workers")
            conn.commit()
            for start in range(0, JOBS, 100):
                jobs = []
                for i in range(start, start + 100):
                    key = f"k{i % KEYS}" if i % 11 else None  # every 11th has no key
                    task = apps.tenant_job.with_options(concurrency_key=key)
                    jobs.append(task.job(key or "-", 0.02, i % 7 == 0))
                queue.enqueue_many(jobs, conn=conn)
                conn.commit()

            def finished() -> bool:
                done = count(conn, schema, "job_history")
                conn.commit()
                return done == JOBS

            wait_until(finished, timeout=180, what=f"{JOBS} finished jobs")
            assert count(conn, schema, "job_history", "status = 'succeeded'") == JOBS
            assert count(conn, schema, "jobs") == 0
            assert count(conn, schema, "concurrency_slots", "running <> 0") == 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        queue.close()

    for proc, log in zip(procs, logs, strict=False):
        output = log.read_text()
        assert proc.returncode == 0, output[-3000:]
        assert "Traceback" not in output and " ERROR " not in output, output[-3000:]
    events: dict[str, list[tuple[int, int]]] = defaultdict(list)
    ended: Counter[int] = Counter()
    for job_id, rest in apps.read_runs(runs):
        kind, key, at, _attempt = rest.split()
        events[key].append((int(at), 1 if kind == "start" else -1))
        if kind == "end":
            ended[job_id] += 1
    assert len(ended) == JOBS and set(ended.values()) == {1}  # each job succeeded once
    peak = {key: _peak(marks) for key, marks in events.items()}
    over = {k: (peak[k], limits[k]) for k in limits if peak[k] > limits[k]}
    assert not over, f"keys over their limit (peak, limit): {over}"
    # The test can tell: more jobs ran at once than one process could run (so the processes
    # competed for the same keys), and keys reached their limits.
    assert _peak([m for marks in events.values() for m in marks]) > 8
    assert sum(peak[k] == limits[k] for k in limits) >= KEYS // 2, (peak, limits)


def _peak(marks: list[tuple[int, int]]) -> int:
    running = top = 0
    for _, step in sorted(marks):  # at one instant an end (-1) sorts before a start
        running += step
        top = max(top, running)
    return top


# Its sampler must see jobs running: with other tests beside it on two cores, the four
# processes finished between its samples and it saw none.
@pytest.mark.alone
def test_claims_and_finishes_of_the_same_keys_never_deadlock(dsn: str) -> None:
    """Four processes claim and finish jobs of 10 keys at a limit of 2, batches of 10. Claims
    take slot rows in key order; finishes once gave slots back in job-id order, and each
    deadlock between the two cost deadlock_timeout (1 s) before the retry (migration 0007);
    and a finish that held its slots could wait for a job row a claim had locked and skipped
    (migration 0038, test_finish_slots.py builds that case on demand). The run counts every
    deadlock its statements hit and the most jobs of a key it saw running
    (bench/tenants/overadmit.py)."""
    args = argparse.Namespace(
        processes=4,
        keys=10,
        limit=2,
        jobs=2000,
        batch=10,
        hold_ms=5.0,
        every_ms=2.0,
        seconds=120.0,
    )
    result = overadmit.run_one(dsn, "job_claim", args)
    assert result["jobs_finished"] == 2000, result
    assert result["deadlocks_retried"] == 0, result
    assert 0 < result["max_running_seen"] <= 2, result
