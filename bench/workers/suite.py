"""Many workers: --workers worker processes (32 by default) sharing one queue, idling, then
draining a backlog, through PgBouncer.

    python -m bench workers [--dsn DSN] [--workers 32] [--concurrency 10] [--pool 20]
                            [--jobs 20000] [--idle 60] [--out DIR] [--short]

Straight to PostgreSQL, each worker holds 4 connections (claim, complete, listen, heartbeat),
so 32 of them need 128, past PostgreSQL's default max_connections of 100. So the workers run
`--poll-only` through PgBouncer in transaction pooling mode (bench/pgbouncer.py), which
shares --pool server connections among all of them. Each phase starts its own workers
(bench/workers/app.py: a no-op task, and a recurring job every second that every
worker's scheduler could enqueue):

- `idle`: nothing to run for --idle seconds. The server connections in use, and the
  server's max_connections; the heartbeat's row writes a second (the
  workers table's updates, from PostgreSQL's statistics); the claims the workers ran, and how
  many found nothing (from each worker's report as it stops); and the recurring job's ticks
  against the seconds the phase lasted: each is enqueued once across all workers.
- `drain`: --jobs no-op jobs enqueued at once, timed until the last has finished. Jobs a
  second; that each ran once; the claims, how many came back empty, and how the jobs spread
  over the workers.

Writes results.json to its results folder (bench/report.py) and prints the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options, pgbouncer
from bench.report import Run, guarded
from bench.server import database, scratch_schema

ROOT = Path(__file__).resolve().parents[2]
# A worker gives running jobs shutdown_grace (30 s) and its services a bounded stop.
STOP_WAIT = 120
START_WAIT = 120
STOPPED = re.compile(r"stopped: (\d+) jobs claimed in (\d+) claims \((\d+) empty\), (\d+) put back")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "workers",
        __doc__.split("\n\n")[0],
        short="the CI run: 32 workers, 2,000 jobs, 10 s idle",
    )
    parser.add_argument("--workers", type=int, default=32, help="worker processes (default 32)")
    parser.add_argument("--concurrency", type=int, default=10, help="per worker (default 10)")
    parser.add_argument(
        "--pool", type=int, default=20, help="PgBouncer's server connections (default 20)"
    )
    parser.add_argument("--jobs", type=int, help="jobs to drain (default 20000)")
    parser.add_argument("--idle", type=float, help="seconds of the idle phase (default 60)")
    args = parser.parse_args(argv)
    options.sized(args, short={"jobs": 2000, "idle": 10.0}, full={"jobs": 20000, "idle": 60.0})
    options.positive(
        parser,
        {
            "--workers": args.workers,
            "--concurrency": args.concurrency,
            "--pool": args.pool,
            "--jobs": args.jobs,
            "--idle": args.idle,
        },
    )
    return args


@contextmanager
def running(
    dsn: str, through: str, schema: str, count: int, concurrency: int, logs: Path
) -> Iterator[tuple[list[Path], float]]:
    """`count` worker processes, polling only through PgBouncer (`through`), until the block
    ends; yields their log files, which hold each one's report once it stopped, and the
    seconds until every one had registered."""
    logs.mkdir(parents=True, exist_ok=True)
    files = [logs / f"worker-{n}.log" for n in range(count)]
    command = [sys.executable, "-m", "pgqueue", "worker", "bench.workers.app:queue"]
    command += ["--dsn", through, "--schema", schema, "--concurrency", str(concurrency)]
    command += ["--poll-only", "--log-level", "info"]
    # A worker that does not stop is dumped by faulthandler on SIGABRT (`_stopped`).
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    procs = []
    for path in files:
        with open(path, "w") as out:
            procs.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        began = time.monotonic()
        deadline = began + START_WAIT
        with psycopg.connect(dsn, autocommit=True) as conn:
            while (up := _scalar(conn, schema, "SELECT count(*) FROM {}.workers")) < count:
                ended = [n for n, p in enumerate(procs) if p.poll() is not None]
                if ended or time.monotonic() > deadline:
                    raise RuntimeError(_not_started(up, count, procs, ended, files))
                time.sleep(0.2)
        yield files, time.monotonic() - began
    finally:
        for proc in procs:
            proc.terminate()
        _stopped(dsn, procs, files)


def _not_started(
    up: int, count: int, procs: list[subprocess.Popen[bytes]], ended: list[int], files: list[Path]
) -> str:
    """Why the start failed, with the end of a log: CI keeps no files of a failed run."""
    if ended:
        codes = ", ".join(f"{n} (exit {procs[n].returncode})" for n in ended)
        shown = ended[0]
        why = f"workers {codes} exited while starting"
    else:
        shown = next((n for n, path in enumerate(files) if "started:" not in path.read_text()), 0)
        why = f"{up} of {count} workers registered in {START_WAIT} s"
    tail = "\n".join(files[shown].read_text().splitlines()[-40:])
    return f"the workers did not all start: {why}; the end of worker {shown}'s log:\n{tail}"


def _stopped(dsn: str, procs: list[subprocess.Popen[bytes]], files: list[Path]) -> None:
    """Wait for the terminated workers. One still running after STOP_WAIT seconds is a bug
    of the worker's stop: what the database was doing, and the worker's threads' stacks
    (faulthandler, on SIGABRT) and the end of its log, go in the error."""
    deadline = time.monotonic() + STOP_WAIT
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    hung = [n for n, proc in enumerate(procs) if proc.poll() is None]
    if not hung:
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        activity = conn.execute(
            "SELECT pid, application_name, state, wait_event_type, wait_event,"
            " now() - state_change, left(query, 120) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    for n in hung:
        procs[n].send_signal(signal.SIGABRT)
    for n in hung:
        try:
            procs[n].wait(timeout=10)
        except subprocess.TimeoutExpired:
            procs[n].kill()
            procs[n].wait()
    tail = "\n".join(files[hung[0]].read_text().splitlines()[-60:])
    sessions = "\n".join(repr(row) for row in activity)
    raise RuntimeError(
        f"workers {hung} had not stopped {STOP_WAIT} s after SIGTERM; the database's "
        f"sessions then:\n{sessions}\nthe end of worker {hung[0]}'s log ({files[hung[0]]}):\n"
        f"{tail}"
    )


def _scalar(conn: psycopg.Connection[Any], schema: str, text: str) -> int:
    row = conn.execute(sql.SQL(text).format(sql.Identifier(schema))).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def _reports(files: list[Path]) -> list[tuple[int, int, int]]:
    """Each worker's (jobs claimed, claims, empty claims), from its stop report."""
    found = []
    for path in files:
        match = STOPPED.search(path.read_text())
        if match is None:
            raise RuntimeError(f"no stop report in {path}")
        found.append((int(match[1]), int(match[2]), int(match[3])))
    return found


def _server_connections(conn: psycopg.Connection[Any]) -> int:
    """Client backends of the database, this one left out: PgBouncer's server connections."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row[0]) if row else 0


def _updates(conn: psycopg.Connection[Any], schema: str, table: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = %s",
        [schema, table],
    ).fetchone()
    return int(row[0]) if row else 0


def idle(
    dsn: str, through: str, workers: int, concurrency: int, seconds: float, logs: Path
) -> dict[str, Any]:
    with (
        scratch_schema(dsn, "bench_workers") as schema,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        row = conn.execute("SELECT current_setting('max_connections')::int").fetchone()
        limit = int(row[0]) if row else 0
        with running(dsn, through, schema, workers, concurrency, logs / "idle") as (files, start):
            time.sleep(2.0)  # every worker past its start
            servers = _server_connections(conn)
            beats = _updates(conn, schema, "workers")
            ticks = _scalar(conn, schema, "SELECT count(*) FROM {}.periodic_ticks")
            started = time.monotonic()
            time.sleep(seconds)
            elapsed = time.monotonic() - started
            beats = _updates(conn, schema, "workers") - beats
            ticks = _scalar(conn, schema, "SELECT count(*) FROM {}.periodic_ticks") - ticks
        reports = _reports(files)
    claims = sum(r[1] for r in reports)
    return {
        "workers": workers,
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "start_seconds": round(start, 1),
        "server_connections": servers,
        "max_connections": limit,
        "heartbeat_writes_per_second": round(beats / elapsed, 2),
        "recurring_ticks": ticks,
        "recurring_ticks_per_second": round(ticks / elapsed, 2),
        "claims": claims,
        "empty_claims": sum(r[2] for r in reports),
        "claims_per_second": round(claims / (elapsed + 2.0), 1),
    }


def drain(
    dsn: str, through: str, workers: int, concurrency: int, jobs: int, logs: Path
) -> dict[str, Any]:
    with (
        scratch_schema(dsn, "bench_workers") as schema,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        with running(dsn, through, schema, workers, concurrency, logs / "drain") as (files, start):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args)"
                    " SELECT 'default', 'bench.noop', '{{}}' FROM generate_series(1, %s)"
                ).format(sql.Identifier(schema)),
                [jobs],
            )
            conn.execute(sql.SQL("SELECT {}.wake('default', 0, 1)").format(sql.Identifier(schema)))
            started = time.monotonic()
            finished = "SELECT count(*) FROM {}.job_history WHERE task = 'bench.noop'"
            while _scalar(conn, schema, finished) < jobs:
                if time.monotonic() - started > 1800:
                    raise RuntimeError("the drain took over 30 minutes")
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            servers = _server_connections(conn)
            once = _scalar(
                conn,
                schema,
                "SELECT count(DISTINCT id) FROM {}.job_history"
                " WHERE task = 'bench.noop' AND attempt = 1 AND status = 'succeeded'",
            )
        reports = _reports(files)
    per_worker = sorted(r[0] for r in reports)
    claims = sum(r[1] for r in reports)
    return {
        "workers": workers,
        "concurrency": concurrency,
        "jobs": jobs,
        "seconds": round(elapsed, 2),
        "start_seconds": round(start, 1),
        "jobs_per_second": round(jobs / elapsed, 1),
        "server_connections": servers,
        "ran_once": once,
        "claims": claims,
        "empty_claims": sum(r[2] for r in reports),
        "empty_share": round(sum(r[2] for r in reports) / max(claims, 1), 3),
        "jobs_per_claim": round(jobs / max(claims, 1), 2),
        "jobs_per_worker": {
            "min": per_worker[0],
            "median": statistics.median(per_worker),
            "max": per_worker[-1],
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("workers", lambda: bench(Run("workers", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        logs = out / "logs"
        with pgbouncer.running(server.dsn, args.pool) as through:
            idled = idle(server.dsn, through, args.workers, args.concurrency, args.idle, logs)
            drained = drain(server.dsn, through, args.workers, args.concurrency, args.jobs, logs)
        figures = {"pool": args.pool, "idle": idled, "drain": drained}
        run.write(out, "results.json", server, figures)
    print(
        f"PostgreSQL {server.version}: {args.workers} workers at concurrency {args.concurrency},"
        f" all registered in {idled['start_seconds']} s (idle) and"
        f" {drained['start_seconds']} s (drain)"
    )
    print(
        f"idle {idled['seconds']} s: {idled['server_connections']} server connections through "
        f"PgBouncer (max_connections {idled['max_connections']}), heartbeat "
        f"writes {idled['heartbeat_writes_per_second']}/s, claims {idled['claims']} "
        f"({idled['empty_claims']} empty), recurring ticks {idled['recurring_ticks']} "
        f"in {idled['seconds']} s"
    )
    print(
        f"drain {drained['jobs']} jobs in {drained['seconds']} s "
        f"({drained['jobs_per_second']}/s) on {drained['server_connections']} server "
        f"connections, ran once {drained['ran_once']}, claims "
        f"{drained['claims']} ({drained['empty_claims']} empty, "
        f"{drained['jobs_per_claim']} jobs a claim), jobs a worker {drained['jobs_per_worker']}"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
