"""The steady bound: the same points in bare SQL on pgqueue's own tables, with no Python.

Owns: one point of the bound. Producers are pgbench running bench/throughput/pgbench/
insert_one.sql (one job row per transaction) from as many connections, at the total rate
(`--rate`: pgbench spaces its transactions as a Poisson process, not evenly); the worker is
one pgbench connection running bench/steady/pgbench/worker.sql (lease a batch, finish it into
history, or sleep 1 ms when there is nothing to lease). Latency is the row's created_at (the
enqueue's transaction) to its started_at (the lease's), read back from job_history. CPU: the
two pgbench processes (their rusage once each has exited) and the server's backends.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path
from typing import Any

import psycopg

from bench.steady import cpu
from bench.steady.point import Point, per_thousand
from bench.throughput import raw
from bench.throughput.systems import SCHEMA

WORKER_SQL = Path(__file__).resolve().parent / "pgbench" / "worker.sql"
BATCH = 100  # pgqueue's Worker claims up to 100 jobs a statement by default


def _children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


def run_point(dsn: str, point: Point, statements: bool) -> dict[str, Any]:
    raw.fill(dsn, 0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.job_history")
    env = os.environ | {"PGOPTIONS": f"-c search_path={SCHEMA}"}
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
        before = _children_seconds()
        producers = subprocess.run(
            _pgbench(dsn, raw.SCRIPTS / "insert_one.sql", point.producers, point.seconds,
                     point.rate),
            env=env, capture_output=True, text=True, timeout=point.seconds * 10 + 60,
            check=False,
        )  # fmt: skip
        producers_cpu = _children_seconds() - before
        if producers.returncode != 0:
            raise RuntimeError(f"pgbench producers failed: {producers.stderr.strip()[-500:]}")
        _, err = worker.communicate(timeout=point.seconds + point.settle + 60)
        worker_cpu = _children_seconds() - before - producers_cpu
        if worker.returncode != 0:
            raise RuntimeError(f"pgbench worker failed: {err.strip()[-500:]}")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
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
