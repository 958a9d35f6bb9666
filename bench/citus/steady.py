"""The Citus bench's steady state: a worker keeping up while producers enqueue at a set rate.

Owns: one steady run of one system. A `pgqueue worker` is started and left running; once it
has registered, PRODUCERS threads enqueue --rate jobs a second in all, one job per
transaction, each thread paced, for --seconds; then the run waits until every one of those
jobs has run, and stops the worker with SIGTERM. Reports each job's wait from the start of
its enqueue's transaction to its start (job_history's started_at - run_at: p50 and p99), how
long the last jobs took to run after the last enqueue, and each server's CPU, WAL and
statements per job over the whole run, the worker's polls between jobs included. Citus
workers are never woken: they poll, every POLL seconds here, for every system.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.citus import app
from bench.citus.meters import Meter, per_job, readings
from bench.citus.produce import PRODUCERS, in_threads, queue_for

ROOT = Path(__file__).resolve().parents[2]
POLL = "0.05"  # the workers' --poll-interval, in seconds
CATCH_UP = 120.0  # seconds after the last enqueue that the jobs may take to run


def worker_command(system: str, dsn: str, schema: str, concurrency: int) -> list[str]:
    """The `pgqueue worker` command line of `system`, without --burst."""
    target = "bench.citus.app:plain" if system == "single" else "bench.citus.app:cluster"
    command = [sys.executable, "-m", "pgqueue", "worker", target, "--dsn", dsn]
    command += ["--schema", schema, "--concurrency", str(concurrency)]
    command += ["--poll-interval", POLL, "--log-level", "warning"]
    if system != "single":
        command += ["--citus-claims", system]
    return command


def _scalar(dsn: str, statement: sql.Composable, params: dict[str, Any] | None = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


def _produce(system: str, dsn: str, schema: str, rate: float, seconds: float, tenants: int) -> int:
    """Enqueue at `rate` for `seconds` from PRODUCERS paced threads; the jobs enqueued."""
    queue = queue_for(system, dsn, schema)
    task = app.noop if system == "single" else app.sharded_noop
    gap = PRODUCERS / rate
    counts = [0] * PRODUCERS
    began = time.monotonic()

    def produce(index: int) -> None:
        n = 0
        while (due := began + index * gap / PRODUCERS + n * gap) < began + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            queue.enqueue(task.job(tenant=f"tenant-{(index + n * PRODUCERS) % tenants}"))
            n += 1
        counts[index] = n

    try:
        in_threads(produce)
    finally:
        queue.close()
    return sum(counts)


def run(
    system: str,
    meters: Sequence[Meter],
    schema: str,
    args: Any,
    log: Path,
) -> dict[str, Any]:
    """One steady run of `system` on `schema` (its queue empty): the figures above."""
    dsn = meters[0].dsn
    history = sql.Identifier(schema, "job_history")
    registered = sql.SQL("SELECT count(*) FROM {} WHERE pid = %(pid)s").format(
        sql.Identifier(schema, "workers")
    )
    since = _scalar(dsn, sql.SQL("SELECT clock_timestamp()"))
    ran = sql.SQL(
        "SELECT count(*) FROM {} WHERE status = 'succeeded' AND run_at >= %(since)s"
    ).format(history)
    with open(log, "w") as out:
        worker = subprocess.Popen(
            worker_command(system, dsn, schema, args.concurrency),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while _scalar(dsn, registered, {"pid": worker.pid}) == 0:
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {system} worker did not start: see {log}")
            time.sleep(0.1)
        before = readings(meters)
        jobs = _produce(system, dsn, schema, args.rate, args.seconds, args.tenants)
        produced_at = time.monotonic()
        while (done := _scalar(dsn, ran, {"since": since})) < jobs:
            if time.monotonic() - produced_at > CATCH_UP:
                raise RuntimeError(f"{system}: {done} of {jobs} jobs ran {CATCH_UP:.0f} s after")
            time.sleep(0.05)
        caught_up = time.monotonic() - produced_at
        after = readings(meters)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    waits = sql.SQL(
        "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
        " (ORDER BY extract(epoch FROM started_at - run_at) * 1000)::float8[]"
        " FROM {} WHERE run_at >= %(since)s"
    ).format(history)
    p50, p99 = _scalar(dsn, waits, {"since": since})
    return {
        "offered_jobs_per_second": args.rate,
        "jobs": jobs,
        "wait_p50_ms": round(p50, 2),
        "wait_p99_ms": round(p99, 2),
        "last_run_after_s": round(caught_up, 2),
        "servers": per_job(before, after, jobs),
    }
