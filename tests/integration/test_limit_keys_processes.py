"""Worker processes killed with kill -9 at random never let a key run over its limit, and
lose no job, while every job holds two limit keys (its tenant's and its user's) and is
claimed fairly between tenants (its fairness key), so rescued jobs come back through the
fair claim too.

A separate connection samples the database as often as it can: in each sample (one
statement, one snapshot) the running jobs carrying each key, and each key's slot counter,
are at most the key's limit. A killed worker's jobs stay running, holding their slots, until
the survivors rescue them; every job must end succeeded.
"""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import count, settings_worker_process, wait_until

WORKERS = 3
TENANTS = 4
USERS = 3  # per tenant
JOBS = 600
FAST: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "lease_timeout": 1.0,
    "rescue_interval": 0.2,
    "concurrency": 8,
}


def _limits() -> dict[str, int]:
    limits = {f"tenant:{t}": 2 + t % 3 for t in range(TENANTS)}
    limits |= {f"user:{t}:{u}": 1 + u % 2 for t in range(TENANTS) for u in range(USERS)}
    return limits


class Sampler(threading.Thread):
    """Samples running jobs per key and slot counters until stopped; keeps the worst seen."""

    def __init__(self, dsn: str, schema: str, limits: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.dsn, self.schema, self.limits = dsn, schema, limits
        self.stop = threading.Event()
        self.samples = 0
        self.over: list[tuple[str, str, int]] = []
        self.peak: dict[str, int] = {}

    def run(self) -> None:
        statement = sql.SQL(
            "SELECT 'jobs', k.key, count(*)::integer FROM {s}.jobs AS j,"
            " unnest({s}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key)"
            " WHERE j.status = 'running' GROUP BY k.key"
            " UNION ALL SELECT 'slot', key, running FROM {s}.concurrency_slots"
        ).format(s=sql.Identifier(self.schema))
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                for source, key, n in conn.execute(statement).fetchall():
                    if n > self.limits[key]:
                        self.over.append((source, key, n))
                    if source == "jobs":
                        self.peak[key] = max(self.peak.get(key, 0), n)
                self.samples += 1


def test_killed_workers_never_let_a_key_over_its_limit_and_lose_no_job(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    limits = _limits()
    for key, n in limits.items():
        queue.set_concurrency_limit(key, n)
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    started = 0

    def start() -> Any:
        nonlocal started
        started += 1
        log = tmp_path / f"worker-{started}.log"
        return settings_worker_process(dsn, schema, FAST, log=log, env=env)

    procs = [start() for _ in range(WORKERS)]
    sampler = Sampler(dsn, schema, limits)
    rng = random.Random(7)
    kills = 0
    try:
        jobs = [
            apps.two_key_job.job(i % TENANTS, (i // TENANTS) % USERS, 0.01 + rng.random() / 50)
            for i in range(JOBS)
        ]
        queue.enqueue_many(jobs)
        sampler.start()
        with psycopg.connect(dsn, autocommit=True) as conn:

            def finished() -> int:
                return count(conn, schema, "job_history")

            # Kill a random worker each time a further tenth of the jobs has finished (an
            # event in the database, not a clock), and start another in its place.
            for tenth in range(1, 8):
                wait_until(
                    lambda t=tenth: finished() >= JOBS * t // 10,
                    timeout=120,
                    what=f"{tenth}0% of the jobs finished",
                )
                victim = procs.pop(rng.randrange(len(procs)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(timeout=30)
                kills += 1
                procs.append(start())
            wait_until(lambda: finished() == JOBS, timeout=180, what=f"{JOBS} finished jobs")
            assert count(conn, schema, "job_history", "status = 'succeeded'") == JOBS
            assert count(conn, schema, "jobs") == 0
            assert count(conn, schema, "concurrency_slots", "running <> 0") == 0
            # Counted in the claims' log until the sweep folds it into fairness_starts.
            fair_starts = conn.execute(
                sql.SQL(
                    "SELECT (SELECT coalesce(sum(started), 0) FROM {0}.fairness_starts)"
                    " + (SELECT coalesce(sum(n), 0) FROM {0}.fairness_start_log,"
                    " unnest(counts) AS n)"
                ).format(sql.Identifier(schema))
            ).fetchone()
            # The fair claim ran (the plain claim takes what its walk leaves, at the end).
            assert fair_starts is not None and fair_starts[0] > 0
    finally:
        sampler.stop.set()
        sampler.join(timeout=30)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        queue.close()

    assert not sampler.over, f"(source, key, running) over the limit: {sampler.over[:10]}"
    ended = {job_id for job_id, _ in apps.read_runs(runs)}
    assert len(ended) == JOBS  # every job's handler ran to its end at least once
    # The test can tell: it sampled often, killed workers, and keys reached their limits.
    assert kills == 7 and sampler.samples > 50, (kills, sampler.samples)
    assert sum(sampler.peak.get(k) == n for k, n in limits.items()) >= len(limits) // 2, (
        sampler.peak,
        limits,
    )
