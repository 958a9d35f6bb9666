"""Does a per-key concurrency claim keep its limit when several processes claim at once?

Owns: one run per claim statement (pgqueue's keyed `job_claim`; the textbook claim, which
counts the running jobs per key with `count(*) ... GROUP BY` and leaves out the full keys), on
a fresh schema each: `--processes` OS processes claim batches of `--batch` jobs, hold each
batch as running for `--hold-ms`, then finish it through `job_finish_many`. A monitor process
counts the running jobs of every key in the table every `--every-ms` and records the largest
count it sees, and how many of its samples found a key over its limit. Prints a table and
writes `overadmit.json`.

The textbook claim decides from a snapshot: two claims that count a key at the same time both
see its free slots, and a batch may take more jobs of a key than it has slots. job_claim
admits each key's jobs through one guarded upsert of the key's slot row, which reads the
latest version under its lock (sql/queries/jobs.sql), so the limit holds.

    python -m bench tenants-overadmit [--dsn DSN] [--out DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.plans import succeeded
from bench.report import Run, guarded
from bench.server import database
from bench.tenants.suite import CEILING, FLOOR, claim_statement, fresh_schema
from pgqueue.queries import query

STATEMENTS = {"job_claim": "branch", "naive": "naive"}


def fill(dsn: str, schema: str, jobs: int, keys: int, limit: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, concurrency_key) "
                "SELECT 'default', 'noop', '{{}}', 'k' || (g %% %s) "
                "FROM generate_series(1, %s) AS g"
            ).format(sql.Identifier(schema)),
            [keys, jobs],
        )
        conn.execute(
            sql.SQL("INSERT INTO {}.concurrency_limits VALUES ('*', %s)").format(
                sql.Identifier(schema)
            ),
            [limit],
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))


def claimer(
    dsn: str, schema: str, kind: str, args: argparse.Namespace, worker: int, deadlocks: Any
) -> None:
    """Claim, hold, finish, until the queue is empty or the time is up. A statement that
    deadlocks is retried, as the worker does (claimer.py, completer.py), and counted."""
    statement = claim_statement(kind, schema)
    finish = query("job_finish_many", schema)
    params: dict[str, Any] = {"queue": "default", "limit": args.batch, "worker_id": worker}
    params |= {"now": None} | FLOOR | CEILING
    deadline = time.monotonic() + args.seconds
    with psycopg.connect(dsn, autocommit=True) as conn:

        def run(query_: Any, values: dict[str, Any]) -> list[Any]:
            while True:
                try:
                    return conn.execute(query_, values).fetchall()
                except psycopg.errors.DeadlockDetected:
                    with deadlocks.get_lock():
                        deadlocks.value += 1

        while time.monotonic() < deadline:
            rows = run(statement, params)
            ids = [r[0] for r in rows if not r[8]]
            if not rows:
                return
            if not ids:
                time.sleep(0.002)
                continue
            time.sleep(args.hold_ms / 1000)
            run(finish, succeeded(ids, worker))


def monitor(dsn: str, schema: str, every: float, stop: Any, out: Any) -> None:
    """The largest running count of any key, sampled from the table."""
    statement = sql.SQL(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {}.jobs "
        "WHERE status = 'running' GROUP BY concurrency_key) AS c"
    ).format(sql.Identifier(schema))
    peak, samples, over = 0, 0, 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            (n,) = conn.execute(statement).fetchone() or (0,)
            samples += 1
            peak = max(peak, int(n))
            over += int(n) > out["limit"]
            time.sleep(every)
    out.update(peak=peak, samples=samples, over=over)


def run_one(dsn: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with fresh_schema(dsn) as schema:
        fill(dsn, schema, args.jobs, args.keys, args.limit)
        manager = ctx.Manager()
        out = manager.dict(limit=args.limit)
        stop = manager.Event()
        deadlocks = ctx.Value("i", 0)
        watcher = ctx.Process(target=monitor, args=(dsn, schema, args.every_ms / 1000, stop, out))
        watcher.start()
        started = time.monotonic()
        workers = [
            ctx.Process(
                target=claimer, args=(dsn, schema, STATEMENTS[name], args, n + 1, deadlocks)
            )
            for n in range(args.processes)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        seconds = time.monotonic() - started
        stop.set()
        watcher.join()
        with psycopg.connect(dsn) as conn:
            (done,) = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.job_history").format(sql.Identifier(schema))
            ).fetchone() or (0,)
        if any(w.exitcode for w in workers):
            raise RuntimeError(f"{name}: a claim process failed")
        return {
            "statement": name,
            "limit": args.limit,
            "max_running_seen": out["peak"],
            "samples": out["samples"],
            "samples_over_limit": out["over"],
            "jobs_finished": int(done),
            "deadlocks_retried": deadlocks.value,
            "seconds": round(seconds, 1),
        }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = options.parser("tenants-overadmit", __doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4, help="claiming processes")
    parser.add_argument("--keys", type=int, default=20, help="concurrency keys")
    parser.add_argument("--limit", type=int, default=2, help="each key's limit")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs in the queue")
    parser.add_argument("--batch", type=int, default=10, help="jobs per claim")
    parser.add_argument("--hold-ms", type=float, default=20.0, help="ms each batch runs")
    parser.add_argument("--every-ms", type=float, default=2.0, help="ms between samples")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds per statement")
    args = parser.parse_args(argv)
    settings = {k: v for k, v in vars(args).items() if k not in ("dsn", "out")}
    options.positive(parser, {f"--{k.replace('_', '-')}": v for k, v in settings.items()})
    run = Run("tenants-overadmit", argv, args.out)
    return guarded("tenants-overadmit", lambda: bench(run, args, settings))


def bench(run: Run, args: argparse.Namespace, settings: dict[str, Any]) -> int:
    with database(options.dsn(args.dsn)) as server:
        out_dir = run.folder(server)
        runs = [run_one(server.dsn, name, args) for name in STATEMENTS]
        run.write(out_dir, "overadmit.json", server, {"settings": settings, "runs": runs})
    print(
        f"{'statement':<10} {'limit':>5} {'max running seen':>16} {'samples over':>12} "
        f"{'of':>6} {'finished':>8} {'deadlocks':>9}"
    )
    for r in runs:
        print(
            f"{r['statement']:<10} {r['limit']:>5} {r['max_running_seen']:>16} "
            f"{r['samples_over_limit']:>12} {r['samples']:>6} {r['jobs_finished']:>8} "
            f"{r['deadlocks_retried']:>9}"
        )
    print(f"bench: wrote {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
