"""One host's worker processes: `pgqueue worker --processes N` for each N asked, alternately.

    python -m bench processes [--dsn DSN] [--processes 1,2] [--concurrency 100]
                              [--jobs 50000] [--rate 3000] [--seconds 20] [--rounds 3]
                              [--out DIR] [--short]

Each round starts the CLI once per N, in an order that alternates between rounds, on a
fresh schema (the no-op task of bench/workers/app.py), and measures:

- `drain`: --jobs no-op jobs inserted at once, timed from the wake-up until the last has
  finished; and that each ran once.
- `steady`: PRODUCERS connections enqueueing one job per transaction at --rate jobs/s in all,
  for --seconds; the wait from the job's insert to its start (job_history's started_at -
  run_at), p50 and p99, and the jobs that had not started 5 s after the last insert.

Each figure is the median of the rounds. Writes results.json to its results folder
(bench/report.py) and prints a table.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema

ROOT = Path(__file__).resolve().parents[2]
START_WAIT = 120
STOP_WAIT = 120
PRODUCERS = 8
# pgqueue's own SQL enqueue: the job and its wake-up, as an application's transaction makes them.
ENQUEUE = "SELECT {}.enqueue('bench.noop')"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "processes", __doc__.split("\n\n")[0], short="the CI run: 2,000 jobs, 2 s steady, 1 round"
    )
    parser.add_argument("--processes", default="1,2", help="each N to run (default 1,2)")
    parser.add_argument("--concurrency", type=int, default=100, help="per process (default 100)")
    parser.add_argument("--jobs", type=int, help="jobs to drain (default 50000)")
    parser.add_argument("--rate", type=float, help="steady jobs/s in all (default 3000)")
    parser.add_argument("--seconds", type=float, help="seconds of steady input (default 20)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"jobs": 2000, "rate": 300.0, "seconds": 2.0, "rounds": 1},
        full={"jobs": 50000, "rate": 3000.0, "seconds": 20.0, "rounds": 3},
    )
    try:
        args.processes = [int(n) for n in args.processes.split(",")]
    except ValueError:
        parser.error(f"--processes takes numbers separated by commas, got {args.processes!r}")
    options.positive(
        parser,
        {
            "--processes": min(args.processes),
            "--concurrency": args.concurrency,
            "--jobs": args.jobs,
            "--rate": args.rate,
            "--seconds": args.seconds,
            "--rounds": args.rounds,
        },
    )
    return args


@contextmanager
def supervisor(dsn: str, schema: str, n: int, concurrency: int, log: Path) -> Iterator[None]:
    """`pgqueue worker --processes n` until the block ends, once all n workers registered;
    stopped by SIGTERM as a service manager would."""
    command = [sys.executable, "-m", "pgqueue", "worker", "bench.workers.app:queue"]
    command += ["--dsn", dsn, "--schema", schema, "--concurrency", str(concurrency)]
    command += ["--processes", str(n), "--log-level", "warning"]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_WAIT
        with psycopg.connect(dsn, autocommit=True) as conn:
            while _scalar(conn, "SELECT count(*) FROM {}.workers", schema) < n:
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = "\n".join(log.read_text().splitlines()[-40:])
                    raise RuntimeError(f"{n} workers did not all start; the log's end:\n{tail}")
                time.sleep(0.1)
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired as late:
            proc.kill()
            proc.wait()
            raise RuntimeError(
                f"--processes {n} had not stopped {STOP_WAIT} s after SIGTERM"
            ) from late


def _scalar(conn: psycopg.Connection[Any], text: str, schema: str) -> int:
    row = conn.execute(sql.SQL(text).format(sql.Identifier(schema))).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _finished(conn: psycopg.Connection[Any], schema: str) -> int:
    return _scalar(conn, "SELECT count(*) FROM {}.job_history WHERE task = 'bench.noop'", schema)


def drain(dsn: str, n: int, concurrency: int, jobs: int, log: Path) -> dict[str, Any]:
    with (
        scratch_schema(dsn, "bench_processes") as schema,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        name = sql.Identifier(schema)
        with supervisor(dsn, schema, n, concurrency, log):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args)"
                    " SELECT 'default', 'bench.noop', '{{}}' FROM generate_series(1, %s)"
                ).format(name),
                [jobs],
            )
            started = time.monotonic()
            conn.execute(sql.SQL("SELECT {}.wake('default', 0, 1)").format(name))
            while _finished(conn, schema) < jobs:
                if time.monotonic() - started > 1800:
                    raise RuntimeError("the drain took over 30 minutes")
                time.sleep(0.02)
            elapsed = time.monotonic() - started
        once = _scalar(
            conn,
            "SELECT count(DISTINCT id) FROM {}.job_history WHERE task = 'bench.noop'"
            " AND attempt = 1 AND status = 'succeeded'",
            schema,
        )
    return {"jobs_per_second": round(jobs / elapsed, 1), "ran_once": once, "jobs": jobs}


def _produce(dsn: str, schema: str, rate: float, until: float, made: list[int], i: int) -> None:
    """Enqueue at `rate` jobs/s, one per transaction, until the monotonic time `until`."""
    statement = sql.SQL(ENQUEUE).format(sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.monotonic()
        while (now := time.monotonic()) < until:
            due = began + made[i] / rate
            if now < due:
                time.sleep(due - now)
                continue
            conn.execute(statement)
            made[i] += 1


def steady(
    dsn: str, n: int, concurrency: int, rate: float, seconds: float, log: Path
) -> dict[str, Any]:
    with (
        scratch_schema(dsn, "bench_processes") as schema,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        with supervisor(dsn, schema, n, concurrency, log):
            made = [0] * PRODUCERS
            until = time.monotonic() + seconds
            threads = [
                threading.Thread(
                    target=_produce, args=(dsn, schema, rate / PRODUCERS, until, made, i)
                )
                for i in range(PRODUCERS)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            total = sum(made)
            settle = time.monotonic() + 5
            while _finished(conn, schema) < total and time.monotonic() < settle:
                time.sleep(0.05)
            behind = total - _finished(conn, schema)
        row = conn.execute(
            sql.SQL(
                "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
                " (ORDER BY extract(epoch FROM started_at - run_at)::float8)"
                " FROM {}.job_history WHERE task = 'bench.noop'"
            ).format(sql.Identifier(schema))
        ).fetchone()
    p50, p99 = row[0] if row and row[0] else (None, None)
    return {
        "produced_per_second": round(total / seconds, 1),
        "p50_ms": None if p50 is None else round(p50 * 1000, 2),
        "p99_ms": None if p99 is None else round(p99 * 1000, 2),
        "behind": behind,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("processes", lambda: bench(Run("processes", argv, args.out, args.short), args))


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    found = [r[key] for r in rounds if r[key] is not None]
    return round(statistics.median(found), 2) if found else None


def bench(run: Run, args: argparse.Namespace) -> int:
    per: dict[int, dict[str, list[dict[str, Any]]]] = {
        n: {"drain": [], "steady": []} for n in args.processes
    }
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        for r in range(args.rounds):
            order = args.processes if r % 2 == 0 else list(reversed(args.processes))
            for n in order:
                log = logs / f"round{r}-processes{n}.log"
                per[n]["drain"].append(drain(server.dsn, n, args.concurrency, args.jobs, log))
                per[n]["steady"].append(
                    steady(server.dsn, n, args.concurrency, args.rate, args.seconds, log)
                )
                print(f"bench: round {r + 1} --processes {n} done", file=sys.stderr)
        figures = {
            "concurrency": args.concurrency,
            "producers": PRODUCERS,
            "rounds": args.rounds,
            "processes": {
                str(n): {
                    "drain_jobs_per_second": _median(got["drain"], "jobs_per_second"),
                    "ran_once": [d["ran_once"] for d in got["drain"]],
                    "jobs": args.jobs,
                    "steady_rate": args.rate,
                    "steady_p50_ms": _median(got["steady"], "p50_ms"),
                    "steady_p99_ms": _median(got["steady"], "p99_ms"),
                    "steady_behind": [s["behind"] for s in got["steady"]],
                    "each_round": got,
                }
                for n, got in per.items()
            },
        }
        run.write(out, "results.json", server, figures)
    print(
        f"PostgreSQL {server.version}; --concurrency {args.concurrency}; medians of "
        f"{args.rounds} round(s)\n"
    )
    print(f"| --processes | drain {args.jobs:,} jobs/s | steady {args.rate:g}/s p50 ms | p99 ms |")
    print("|---:|---:|---:|---:|")
    for n, got in figures["processes"].items():
        print(
            f"| {n} | {got['drain_jobs_per_second']:,} | {got['steady_p50_ms']} | "
            f"{got['steady_p99_ms']} |"
        )
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
