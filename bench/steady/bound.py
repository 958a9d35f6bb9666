"""The steady bounds: the same points in bare SQL on pgqueue's own tables.

Owns: one point of a bound. The worker is one pgbench connection running bench/steady/
pgbench/worker.sql (lease a batch, finish it into history, or sleep 1 ms when there is
nothing to lease). Producers send bench/throughput/pgbench/insert_one.sql's INSERT (one job
row per transaction) from as many connections, at the total rate, in one of two ways:

- `bound`: pgbench (`--rate`: it spaces its transactions as a Poisson process, not evenly),
  what the server can take with producers that cost next to nothing;
- `bound_psycopg`: the suite's own producer processes (bench/steady/point.py), paced as every
  system's are, each connection sending the bare INSERT from psycopg: what the same point
  leaves for a worker once Python producers have taken their share of the machine. They are
  warmed as every system's are; pgbench's connections are its own and start cold, which
  costs its bare INSERT little (no function, trigger or RETURNING to set up).

Latency is the row's created_at (the enqueue's transaction) to its started_at (the lease's),
read back from job_history. CPU: the producer processes (pgbench's rusage once it has
exited; the Python producers' from /proc), the worker pgbench's rusage, and the server's
backends.
"""

from __future__ import annotations

import os
import subprocess
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import psycopg

from bench.steady import cpu
from bench.steady.point import Point, Producers, delta, per_thousand
from bench.throughput import raw
from bench.throughput.systems import SCHEMA, Producer

WORKER_SQL = Path(__file__).resolve().parent / "pgbench" / "worker.sql"
BATCH = 100  # pgqueue's Worker claims up to 100 jobs a statement by default


def _pgbench(
    dsn: str, script: Path, clients: int, seconds: float, rate: float | None = None
) -> list[str]:
    command = [
        raw.pgbench_path(), "-n", "-M", "prepared", "-c", str(clients),
        "-j", str(min(clients, 4)), "-T", str(max(1, round(seconds))), "-f", str(script),
        "-D", f"batch={BATCH}",
    ]  # fmt: skip
    if rate is not None:
        command += ["-R", f"{rate:g}"]
    return [*command, dsn]


def bare_producer(dsn: str) -> Producer:
    return raw.BareProducer(dsn)


def run_point(
    dsn: str, point: Point, statements: bool, ctx: BaseContext | None = None
) -> dict[str, Any]:
    """One point of `bound` or, given a process context for the Python producers,
    `bound_psycopg`."""
    raw.fill(dsn, 0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.job_history")
    env = os.environ | {"PGOPTIONS": f"-c search_path={SCHEMA}"}
    # Connected before the worker's clock starts: spawning them takes a second or more.
    python = None if ctx is None else Producers(ctx, bare_producer, dsn, point)
    if python is not None:
        # Their warm-up jobs: no worker has run yet, so none is in history. A DELETE, not a
        # TRUNCATE, leaves the producers' prepared statements planned.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DELETE FROM {SCHEMA}.jobs")
    try:
        sampler = cpu.BackendSampler(dsn).start()
        ms_before = cpu.statements_ms(dsn) if statements else None
        written_before = cpu.write_counters(dsn)
        worker = subprocess.Popen(
            _pgbench(dsn, WORKER_SQL, 1, point.seconds + point.settle),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            before = cpu.children_seconds()
            producers_cpu: float | None
            if python is None:
                producers_cpu = _pgbench_producers(dsn, point, env)
            else:
                cpu_before = python.cpu()
                python.go()
                python.committed()
                producers_cpu = delta(cpu_before, python.cpu())
            _, err = worker.communicate(timeout=point.seconds + point.settle + 60)
            # The children waited for since `before`: the worker, and pgbench's producers
            # (the Python ones are waited for later, when they are closed).
            worker_cpu = (
                cpu.children_seconds() - before - (producers_cpu if python is None else 0.0)
            )
            if worker.returncode != 0:
                raise RuntimeError(f"pgbench worker failed: {err.strip()[-500:]}")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    finally:
        if python is not None:
            python.close()
    written = cpu.writes(written_before, cpu.write_counters(dsn))
    figures = _figures(dsn, point) | written
    figures["cpu_s"] = {
        "producers": producers_cpu,
        "worker": worker_cpu,
        "server_backends": sampler.stop(),
    }
    if ms_before is not None:
        figures["statements_ms"] = cpu.statements_ms(dsn) - ms_before
    return figures | per_thousand(figures)


def _pgbench_producers(dsn: str, point: Point, env: dict[str, str]) -> float:
    """pgbench producing the point; its CPU seconds."""
    before = cpu.children_seconds()
    producers = subprocess.run(
        _pgbench(dsn, raw.SCRIPTS / "insert_one.sql", point.producers, point.seconds, point.rate),
        env=env, capture_output=True, text=True, timeout=point.seconds * 10 + 60, check=False,
    )  # fmt: skip
    if producers.returncode != 0:
        raise RuntimeError(f"pgbench producers failed: {producers.stderr.strip()[-500:]}")
    return cpu.children_seconds() - before


def _figures(dsn: str, point: Point) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute(f"SELECT count(*) FROM {SCHEMA}.jobs").fetchone()
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(created_at) - min(created_at)),"
            " extract(epoch FROM max(started_at) - min(created_at)),"
            " percentile_disc(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP"
            "   (ORDER BY extract(epoch FROM started_at - created_at) * 1000),"
            " extract(epoch FROM max(started_at - created_at)) * 1000"
            f" FROM {SCHEMA}.job_history"
        ).fetchone()
    assert row is not None and left is not None
    done, produced_s, finished_s, (p50, p90, p99), worst = row
    queued = int(left[0])
    figures: dict[str, Any] = {
        "offered_per_s": point.rate,
        "jobs": int(done) + queued,
        "started": int(done),
        "fell_behind": queued > 0,
    }
    if done:
        figures |= {
            "produced_per_s": int(done) / max(1e-9, float(produced_s)),
            "finished_per_s": int(done) / max(1e-9, float(finished_s)),
            "p50_ms": float(p50),
            "p90_ms": float(p90),
            "p99_ms": float(p99),
            "max_ms": float(worst),
        }
    return figures
