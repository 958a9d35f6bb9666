"""How job records read when history is large: get_job and list_jobs at 1M rows.

    python -m bench records [--dsn DSN] [--history 1000000] [--repeat 20] [--out DIR]

Fills a fresh schema's history (dropped afterwards) with --history finished jobs spread over
30 days, 10 queues and 50 tasks (one task rare: 1 job in 10,000), 95% succeeded, 4% failed,
1% cancelled, and 1,000 live jobs; ANALYZEs; then times each read --repeat times on one
connection and reports the median and the worst, in milliseconds:

- `get_job` of random ids (live and finished);
- `list_jobs` pages of 50: newest, by queue, by common task, by rare task, failed only,
  created within one day a week ago, a deep page (before_id in the middle), live only;
- the history probe of a windowed dedupe key (`job_insert_unique` in a rolled-back
  transaction).

Writes results.json to its results folder (bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue

FILL = """
INSERT INTO {history} (id, queue, task, args, status, priority, attempt, max_attempts, run_at,
                       created_at, started_at, finished_at, worker_id, errors, result, dedupe_key)
SELECT g, 'q' || (g %% 10), CASE WHEN g %% 10000 = 0 THEN 'rare' ELSE 't' || (g %% 49) END,
       jsonb_build_object('n', g),
       CASE WHEN g %% 100 < 95 THEN 'succeeded' WHEN g %% 100 < 99 THEN 'failed'
            ELSE 'cancelled' END,
       0, 1, 25, ts, ts, ts, ts + interval '1 second', 1, '[]', jsonb_build_object('rows', g),
       'key:' || g
FROM generate_series(1, %(rows)s) AS g,
     LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / %(rows)s) AS ts) AS t
"""


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser("records", __doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    if args.history < 10_000 or args.repeat < 1:
        parser.error("--history must be at least 10000 and --repeat at least 1")
    return args


def fill(conn: psycopg.Connection[Any], schema: str, rows: int, queue: Queue) -> None:
    history = sql.Identifier(schema, "job_history")
    conn.execute(sql.SQL(FILL).format(history=history), {"rows": rows})
    conn.execute(
        sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'id'), %s)").format(
            sql.Literal(f'"{schema}".jobs')
        ),
        [rows],
    )
    conn.commit()
    task = queue.declare("t1")
    queue.enqueue_many([task.job(n=n) for n in range(1000)], conn=conn)
    conn.commit()
    conn.execute(sql.SQL("ANALYZE {}").format(history))
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "jobs")))
    conn.commit()


def timed(action: Callable[[], Any], repeat: int) -> dict[str, float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}


def reads(conn: psycopg.Connection[Any], queue: Queue, rows: int) -> dict[str, Callable[[], Any]]:
    rng = random.Random(1)
    week_ago = datetime.now(timezone.utc) - timedelta(days=7)
    dedupe = queue.declare("dedupe")

    def windowed_enqueue() -> None:
        queue.enqueue(
            dedupe.job(),
            conn=conn,
            dedupe_key=f"key:{rng.randrange(rows)}",
            dedupe_window=3600 * 24 * 31,
        )
        conn.rollback()

    return {
        "get_job": lambda: queue.get_job(rng.randrange(1, rows + 1000), conn=conn),
        "list newest": lambda: queue.list_jobs(conn=conn),
        "list by queue": lambda: queue.list_jobs(conn=conn, queue="q3"),
        "list by common task": lambda: queue.list_jobs(conn=conn, task="t7"),
        "list by rare task": lambda: queue.list_jobs(conn=conn, task="rare"),
        "list failed": lambda: queue.list_jobs(conn=conn, status="failed"),
        "list one day, a week ago": lambda: queue.list_jobs(
            conn=conn, created_after=week_ago, created_before=week_ago + timedelta(days=1)
        ),
        "list deep page": lambda: queue.list_jobs(conn=conn, before_id=rows // 2),
        "list live only": lambda: queue.list_jobs(conn=conn, status=["queued", "running"]),
        "windowed dedupe enqueue": windowed_enqueue,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("records", lambda: bench(Run("records", argv, args.out), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        with scratch_schema(server.dsn, "bench_records") as schema:
            queue = Queue(schema=schema)
            with psycopg.connect(server.dsn, application_name="bench:records") as conn:
                started = time.perf_counter()
                fill(conn, schema, args.history, queue)
                fill_seconds = time.perf_counter() - started
                results = {
                    name: timed(action, args.repeat)
                    for name, action in reads(conn, queue, args.history).items()
                }
                conn.rollback()
        figures = {
            "history_rows": args.history,
            "fill_seconds": round(fill_seconds, 1),
            "repeat": args.repeat,
            "reads": results,
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}, {args.history:,} finished jobs in history")
    print(f"{'read':<28}{'median ms':>10}{'max ms':>10}")
    for name, row in results.items():
        print(f"{name:<28}{row['median_ms']:>10.2f}{row['max_ms']:>10.2f}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
