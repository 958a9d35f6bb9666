"""Memory: a worker's resident set, idle, then draining a large backlog for a long while.

    python -m bench memory [--dsn DSN] [--jobs 1000000] [--seconds 600] [--every 10]
                           [--concurrency 100] [--out DIR] [--short]

One `pgqueue worker` process (bench/workflows/app.py, concurrency --concurrency) starts on an
empty queue; its RSS (VmRSS, from /proc) after 10 s idle is the idle figure. Then --jobs
no-op jobs are inserted at once, and its RSS is sampled every --every seconds for --seconds
while it drains them (the backlog outlasts the run unless the machine is fast). A flat RSS
is the goal: the mean of the last minute against the second sample.

Writes results.json to its results folder (bench/report.py) and prints the figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from bench.workflows.suite import fill

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "memory",
        __doc__.split("\n\n")[0],
        short="the CI run: 20,000 jobs, 30 s sampled every 2 s",
    )
    parser.add_argument("--jobs", type=int, help="backlog (default 1000000)")
    parser.add_argument("--seconds", type=float, help="length of the drain (default 600)")
    parser.add_argument("--every", type=float, help="seconds between samples (default 10)")
    parser.add_argument("--concurrency", type=int, default=100, help="the worker's (default 100)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"jobs": 20_000, "seconds": 30.0, "every": 2.0},
        full={"jobs": 1_000_000, "seconds": 600.0, "every": 10.0},
    )
    options.positive(
        parser,
        {
            "--jobs": args.jobs,
            "--seconds": args.seconds,
            "--every": args.every,
            "--concurrency": args.concurrency,
        },
    )
    return args


def rss_mb(pid: int) -> float:
    """The process's resident set, in MB (Linux: /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmRSS for process {pid}")


def measure(dsn: str, jobs: int, seconds: float, every: float, concurrency: int) -> dict[str, Any]:
    with scratch_schema(dsn, "bench_memory") as schema:
        log = Path(f"/tmp/pgqueue-bench-memory-{schema}.log")
        with open(log, "w") as out:
            command = [sys.executable, "-m", "pgqueue", "worker", "bench.workflows.app:queue"]
            command += ["--dsn", dsn, "--schema", schema, "--concurrency", str(concurrency)]
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            time.sleep(10.0)
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited: {log.read_text()[-2000:]}")
            idle = rss_mb(proc.pid)
            fill(dsn, schema, jobs, chained=False)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("SELECT {}.wake('default', 0, 1)").format(sql.Identifier(schema))
                )
                samples: list[tuple[float, float]] = []
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < seconds:
                    samples.append((round(elapsed, 1), rss_mb(proc.pid)))
                    time.sleep(every)
                done = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.job_history").format(sql.Identifier(schema))
                ).fetchone()
        finally:
            proc.terminate()
            proc.wait(timeout=120)
            log.unlink(missing_ok=True)
    second = samples[1][1] if len(samples) > 1 else samples[0][1]
    last_minute = [mb for at, mb in samples if at >= seconds - 60.0] or [samples[-1][1]]
    tail = statistics.mean(last_minute)
    return {
        "concurrency": concurrency,
        "jobs": jobs,
        "seconds": seconds,
        "every": every,
        "idle_rss_mb": idle,
        "drained": int(done[0]) if done else 0,
        "samples": samples,
        "second_sample_mb": second,
        "last_minute_mean_mb": round(tail, 1),
        "last_minute_vs_second": round(tail / second - 1, 4),
        "peak_mb": max(mb for _, mb in samples),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("memory", lambda: bench(Run("memory", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        figures = measure(server.dsn, args.jobs, args.seconds, args.every, args.concurrency)
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}: a worker at concurrency {args.concurrency}")
    print(
        f"idle RSS {figures['idle_rss_mb']} MB; draining {figures['jobs']} jobs for "
        f"{figures['seconds']:g} s ({figures['drained']} done): second sample "
        f"{figures['second_sample_mb']} MB, last minute {figures['last_minute_mean_mb']} MB "
        f"({figures['last_minute_vs_second']:+.1%}), peak {figures['peak_mb']} MB"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
