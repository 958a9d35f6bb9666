"""Durable steps under kill -9: real `pgqueue worker` processes are killed at random moments
while ten-step jobs run, lease and atomic, and replaced. No atomic step's write commits twice,
no lease step runs again once its record committed, and every job ends with the right result.

The suite runs `CHAOS_JOBS` jobs; the full run, `PGQUEUE_DURABLE_CHAOS_JOBS=1000 pytest
tests/integration/test_durable_chaos.py`, takes a few minutes. The kills' timing comes from a
seed, printed on failure (`PGQUEUE_DURABLE_CHAOS_SEED` replays it).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import Queue
from tests.apps import durable_app
from tests.conftest import stop_worker_processes, wait_until, worker_process

CHAOS_JOBS = int(os.environ.get("PGQUEUE_DURABLE_CHAOS_JOBS", "100"))
WORKERS = 3
FAST = ["--concurrency", "8", "--atomic-concurrency", "4", "--heartbeat-interval", "0.2",
        "--lease-timeout", "1", "--rescue-interval", "0.2", "--poll-interval", "0.2"]  # fmt: skip


def test_kill_9_at_random_moments_neither_repeats_a_recorded_step_nor_loses_a_job(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    seed = int(os.environ.get("PGQUEUE_DURABLE_CHAOS_SEED", str(random.randrange(2**32))))
    chance = random.Random(seed)
    queue = Queue(dsn, schema=schema)
    queue.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.chaos_runs (job bigint, step int, at timestamptz"
                " NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(schema))
        )
    jobs = [
        (durable_app.atomic_job if n % 2 else durable_app.lease_job).job(schema)
        for n in range(CHAOS_JOBS)
    ]
    ids = queue.enqueue_many(jobs)
    env = {"PGQUEUE_TEST_DSN": dsn}
    app = "tests.apps.durable_app:queue"
    started = 0

    def start() -> Any:
        nonlocal started
        started += 1
        log = tmp_path / f"worker-{started}.log"
        return worker_process(dsn, schema, *FAST, log=log, env=env, app=app)

    procs = [start() for _ in range(WORKERS)]
    kills = 0
    try:
        while _unfinished(dsn, schema) and kills < 4 * CHAOS_JOBS:
            time.sleep(chance.uniform(0.1, 0.8))  # a random moment: what the kill lands on
            # A worker that is running jobs, when one is: a replacement still starting up
            # has none, and the jobs are short enough to all end between a few kills.
            busy = _busy_pids(dsn, schema)
            victim = chance.choice([p for p in procs if p.pid in busy] or procs)
            procs.remove(victim)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            kills += 1
            procs.append(start())
        wait_until(lambda: not _unfinished(dsn, schema), timeout=120, what="every job to end")
    finally:
        stop_worker_processes(procs)
        queue.close()
    context = f"seed {seed}, {kills} kills"
    assert kills >= 1, context
    with psycopg.connect(dsn) as conn:
        ended: dict[int, str] = dict(
            conn.execute(
                sql.SQL("SELECT id, status || ' ' || coalesce(result::text, '')"
                        " FROM {}.job_history").format(sql.Identifier(schema))
            ).fetchall()
        )  # fmt: skip
        atomic_runs = conn.execute(
            sql.SQL(
                "SELECT r.job, r.step, count(*) FROM {0}.chaos_runs AS r"
                " JOIN {0}.job_history AS h ON h.id = r.job AND h.atomic"
                " GROUP BY 1, 2 HAVING count(*) <> 1"
            ).format(sql.Identifier(schema))
        ).fetchall()
        reruns = conn.execute(
            sql.SQL(
                "SELECT r.job, r.step, r.at, s.finished_at FROM {0}.chaos_runs AS r"
                " JOIN {0}.job_history AS h ON h.id = r.job AND NOT h.atomic"
                " JOIN {0}.job_steps AS s ON s.job_id = r.job AND s.seq = r.step"
                " WHERE r.at > s.finished_at"
            ).format(sql.Identifier(schema))
        ).fetchall()
        rescued = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job_history WHERE attempt > 1").format(
                sql.Identifier(schema)
            )
        ).fetchone()
        recorded = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job_steps").format(sql.Identifier(schema))
        ).fetchone()
    wrong = {i: ended.get(i) for i in ids if ended.get(i) != f"succeeded {durable_app.expected(i)}"}
    assert wrong == {}, context
    assert atomic_runs == [], f"atomic steps whose write committed other than once ({context})"
    assert reruns == [], f"lease steps run again after their record committed ({context})"
    assert recorded == (CHAOS_JOBS * durable_app.STEPS,), context
    # The kills landed on running jobs: some were rescued and replayed their steps.
    assert rescued is not None and rescued[0] >= 1, context
    print(f"{context}, {rescued[0]} jobs rescued")


def _unfinished(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return int(row[0])


def _busy_pids(dsn: str, schema: str) -> set[int]:
    """The process ids of the workers running jobs now."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT DISTINCT w.pid FROM {0}.jobs AS j JOIN {0}.workers AS w"
                " ON w.id = j.worker_id WHERE j.status = 'running'"
            ).format(sql.Identifier(schema))
        ).fetchall()
    return {row[0] for row in rows}
