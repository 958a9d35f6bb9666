"""What a dedupe key costs at enqueue.

    python -m bench dedupe [--dsn DSN] [--batch 100] [--rounds 40] [--history 100000] [--out DIR]

On a fresh schema (dropped afterwards), one connection enqueues batches of no-op jobs with
`Queue.enqueue_many`, committing each batch, in four modes taken in turn, round after round,
so that a slow moment of a shared machine falls on every mode alike:

- `plain`: no key (job_insert, as before dedupe existed);
- `keyed`: a new key per job (job_insert_unique: ON CONFLICT DO NOTHING on the key index);
- `keyed_window`: the same with a 10-minute window, against --history finished keyed jobs
  (the history lookup, a savepoint and the recheck statement);
- `existing`: keys whose job is live, so every job resolves to it and nothing is inserted.

Writes results.json (jobs per second per mode and the ratio to `plain`) to its results folder
(bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue

MODES = ("plain", "keyed", "keyed_window", "existing")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser("dedupe", __doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100, help="jobs per enqueue_many")
    parser.add_argument("--rounds", type=int, default=40, help="batches per mode")
    parser.add_argument("--history", type=int, default=100_000, help="finished keyed jobs")
    args = parser.parse_args(argv)
    for name in ("batch", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be 1 or more")
    if args.history < 0:
        parser.error("--history must be 0 or more")
    return args


def fill_history(conn: psycopg.Connection[Any], schema: str, rows: int) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.job_history (id, queue, task, args, status, priority, attempt,"
            " max_attempts, run_at, created_at, finished_at, dedupe_key)"
            " SELECT -g, 'default', 'noop', '{{}}', 'succeeded', 0, 1, 1, now(), now(),"
            " now() - (g %% 3600) * interval '1 second', 'old:' || g"
            " FROM generate_series(1, %s) AS g"
        ).format(sql.Identifier(schema)),
        [rows],
    )
    conn.execute(sql.SQL("ANALYZE {}.job_history").format(sql.Identifier(schema)))
    conn.commit()


def batch_for(mode: str, task: Any, size: int, live_keys: list[str]) -> list[Any]:
    if mode == "plain":
        return [task.job() for _ in range(size)]
    if mode == "existing":
        return [task.with_options(dedupe_key=key).job() for key in live_keys[:size]]
    window = {"dedupe_window": 600} if mode == "keyed_window" else {}
    return [task.with_options(dedupe_key=uuid.uuid4().hex, **window).job() for _ in range(size)]


def measure(dsn: str, schema: str, args: argparse.Namespace) -> dict[str, Any]:
    queue = Queue(schema=schema)
    task = queue.declare("noop")
    seconds = dict.fromkeys(MODES, 0.0)
    with psycopg.connect(dsn, application_name="bench:dedupe") as conn:
        fill_history(conn, schema, args.history)
        live_keys = [f"live:{n}" for n in range(args.batch)]
        queue.enqueue_many([task.with_options(dedupe_key=k).job() for k in live_keys], conn=conn)
        conn.commit()
        for _ in range(args.rounds):
            for mode in MODES:
                jobs = batch_for(mode, task, args.batch, live_keys)
                started = time.perf_counter()
                got = queue.enqueue_many(jobs, conn=conn)
                conn.commit()
                seconds[mode] += time.perf_counter() - started
                assert all(g.created for g in got) == (mode != "existing")
    jobs = args.batch * args.rounds
    rates = {mode: jobs / seconds[mode] for mode in MODES}
    return {
        mode: {
            "jobs": jobs,
            "seconds": round(seconds[mode], 4),
            "jobs_per_second": round(rates[mode], 1),
            "ratio_to_plain": round(rates[mode] / rates["plain"], 3),
        }
        for mode in MODES
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("dedupe", lambda: bench(Run("dedupe", argv, args.out), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        with scratch_schema(server.dsn, "bench_dedupe") as schema:
            modes = measure(server.dsn, schema, args)
        figures = {
            "batch": args.batch,
            "rounds": args.rounds,
            "history_rows": args.history,
            "modes": modes,
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}, batches of {args.batch}, {args.rounds} each")
    print(f"{'mode':<14}{'jobs/s':>10}{'vs plain':>10}")
    for mode, row in modes.items():
        print(f"{mode:<14}{row['jobs_per_second']:>10,.0f}{row['ratio_to_plain']:>10.2f}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
