"""Rate limits: what the limit costs a claim, and whether a limited queue holds its rate.

    python -m bench rates [--dsn DSN] [--jobs 20000] [--rate 50] [--seconds 60] [--workers 2]
                          [--out DIR] [--short]

- `cost`: schemas of --jobs queued no-op jobs each, drained by one connection in batches of
  10, taking turns claim by claim: `unlimited` (job_claim_unkeyed, a queue without keys or
  limit), `keyed_statement` (job_claim, which the rated claim is built on), `rated_N`
  (job_claim_rated under a queue limit of N starts per window that it never reaches at this
  pace, so every claim pays the full bookkeeping: the lock, the count, the record of the N
  most recent starts), `task_rated_N` (the same with the limit on the jobs' task instead),
  and `other_task_limited` (job_claim_unkeyed told of a limit on a task the queue does not
  hold: what the claim of a queue without the limited tasks pays while they have limits).
- `hold`: --workers worker processes (`pgqueue worker`, concurrency 20 each) drain a backlog
  far larger than the limit allows, on a queue limited to --rate starts a second, for
  --seconds. From the jobs' started_at (the times the limit records): the rate reached, its
  error against the limit, and the most starts in any one-second window.
- `task_hold`: the same with the limit on a task, in a queue shared with as many jobs of an
  unlimited task, which drain meanwhile; also how many times the limited jobs were put back
  per start (each a row update).

Writes results.json to its results folder (bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from bench.workflows.suite import Drain, fill, workers
from pgqueue import Queue
from pgqueue.queries import query

# The cost scenarios' limits, (starts, per seconds): far above what one connection claims, so
# that they never bind, with 100 and 10,000 recent starts to keep and rewrite.
RATED = ((100, 0.001), (10_000, 0.1))
Limit = tuple[str, str, int, float]  # ("queue" | "task", name, starts, per seconds)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "rates",
        __doc__.split("\n\n")[0],
        short="the CI run: 2,000 jobs, a 5-second hold at 20 a second",
    )
    parser.add_argument("--jobs", type=int, help="queued jobs per cost scenario (default 20000)")
    parser.add_argument("--rate", type=int, help="the held queue's limit a second (default 50)")
    parser.add_argument("--seconds", type=float, help="length of the hold (default 60)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"jobs": 2000, "rate": 20, "seconds": 5.0},
        full={"jobs": 20000, "rate": 50, "seconds": 60.0},
    )
    options.positive(
        parser,
        {
            "--jobs": args.jobs,
            "--rate": args.rate,
            "--seconds": args.seconds,
            "--workers": args.workers,
        },
    )
    return args


class RatedDrain(Drain):
    def __init__(self, dsn: str, schema: str, statement: str, limited: list[str]) -> None:
        super().__init__(dsn, schema)
        self.claim = query(statement, schema)
        self.params["limited_tasks"] = limited
        self.params["job_limits"] = bool(limited)
        # No start margin: a limit's window is then its period alone, so that the cost
        # scenarios' limits never bind (a claim that found one full would end its drain);
        # the statement and its bookkeeping are the same for any margin.
        self.params["start_margin"] = timedelta(0)


def cost(dsn: str, jobs: int) -> dict[str, Any]:
    import random

    with contextlib.ExitStack() as stack:
        drains: dict[str, Drain] = {}
        scenarios: list[tuple[str, str, Limit | None]] = [
            ("unlimited", "job_claim_unkeyed", None),
            ("keyed_statement", "job_claim", None),
        ]
        scenarios += [
            (f"rated_{n}", "job_claim_rated", ("queue", "default", n, per)) for n, per in RATED
        ]
        scenarios += [
            (f"task_rated_{n}", "job_claim_rated", ("task", "noop", n, per)) for n, per in RATED
        ]
        scenarios.append(("other_task_limited", "job_claim_unkeyed", ("task", "other", 10, 1.0)))
        for name, statement, limit in scenarios:
            schema = stack.enter_context(scratch_schema(dsn, "bench_rates"))
            fill(dsn, schema, jobs, chained=False)
            if limit is not None:
                kind, target, starts, per = limit
                queue = Queue(dsn, schema=schema)
                if kind == "queue":
                    queue.set_rate_limit(target, starts, per=per)
                else:
                    queue.set_task_rate_limit(target, starts, per=per)
                queue.close()
            limited = [limit[1]] if limit is not None and limit[0] == "task" else []
            drains[name] = RatedDrain(dsn, schema, statement, limited)
        active = list(drains)
        while active:
            random.shuffle(active)
            active = [name for name in active if drains[name].step()]
        results = {name: d.result() for name, d in drains.items()}
    base = results["unlimited"]["claim_ms_p50"]
    for row in results.values():
        row["claim_ratio_to_unlimited"] = round(row["claim_ms_p50"] / base, 3)
    return results


def most_in_any_window(starts: list[float], period: float) -> int:
    starts = sorted(starts)
    return max(bisect.bisect_left(starts, s + period) - i for i, s in enumerate(starts))


def hold(dsn: str, rate: int, seconds: float, worker_count: int) -> dict[str, Any]:
    backlog = int(rate * (seconds + 10) * 1.5)  # more than the limit lets through
    with scratch_schema(dsn, "bench_rates") as schema:
        queue = Queue(dsn, schema=schema)
        queue.set_rate_limit("default", rate, per=1)
        fill(dsn, schema, backlog, chained=False)
        with workers(dsn, schema, worker_count, 20):
            time.sleep(seconds + 4)
        queue.close()
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT extract(epoch FROM started_at)::float8 FROM {}.job_history").format(
                    sql.Identifier(schema)
                )
            ).fetchall()
    starts = sorted(r[0] for r in rows)
    if len(starts) < rate:
        raise RuntimeError(f"only {len(starts)} jobs started in the hold")
    # The middle `seconds`, after the first two: workers start and the first window fills.
    begin = starts[0] + 2.0
    window = [s for s in starts if begin <= s < begin + seconds]
    reached = len(window) / seconds
    return {
        "limit_per_second": rate,
        "seconds": seconds,
        "backlog": backlog,
        "started": len(starts),
        "rate_reached": round(reached, 2),
        "error_vs_limit": round(reached / rate - 1, 4),
        "most_in_any_second": most_in_any_window(starts, 1.0),
    }


def task_hold(dsn: str, rate: int, seconds: float, worker_count: int) -> dict[str, Any]:
    backlog = int(rate * (seconds + 10) * 1.5)
    with scratch_schema(dsn, "bench_rates") as schema:
        queue = Queue(dsn, schema=schema)
        queue.set_task_rate_limit("noop", rate, per=1)
        table = sql.Identifier(schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # The limited task's jobs and as many of an unlimited one, interleaved by id.
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args) "
                    "SELECT 'default', CASE WHEN g %% 2 = 0 THEN 'noop' ELSE 'bench.free' END,"
                    " '{{}}' FROM generate_series(1, %s) AS g"
                ).format(table),
                [2 * backlog],
            )
            before = _updates(conn, schema)
            with workers(dsn, schema, worker_count, 20):
                time.sleep(seconds + 4)
            queue.close()
            rows = conn.execute(
                sql.SQL(
                    "SELECT task, extract(epoch FROM started_at)::float8 FROM {}.job_history"
                ).format(table)
            ).fetchall()
            updates = _updates(conn, schema) - before
    starts = sorted(r[1] for r in rows if r[0] == "noop")
    free = sum(1 for r in rows if r[0] == "bench.free")
    if len(starts) < rate:
        raise RuntimeError(f"only {len(starts)} limited jobs started in the hold")
    begin = starts[0] + 2.0
    window = [s for s in starts if begin <= s < begin + seconds]
    reached = len(window) / seconds
    # Each started job was updated once by its claim; the rest are puts back and promotions.
    claimed = len(rows)
    return {
        "limit_per_second": rate,
        "seconds": seconds,
        "backlog": backlog,
        "started": len(starts),
        "unlimited_done": free,
        "unlimited_backlog": backlog,
        "rate_reached": round(reached, 2),
        "error_vs_limit": round(reached / rate - 1, 4),
        "most_in_any_second": most_in_any_window(starts, 1.0),
        "row_updates_per_start": round((updates - claimed) / max(len(starts), 1), 2),
    }


def _updates(conn: psycopg.Connection[Any], schema: str) -> int:
    """Row updates of the schema's jobs table so far (the statistics collector's count)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
        [schema],
    ).fetchone()
    return int(row[0]) if row else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("rates", lambda: bench(Run("rates", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        costs = cost(server.dsn, args.jobs)
        held = hold(server.dsn, args.rate, args.seconds, args.workers)
        task_held = task_hold(server.dsn, args.rate, args.seconds, args.workers)
        figures = {
            "batch": 10,
            "jobs": args.jobs,
            "cost": costs,
            "hold": held,
            "task_hold": task_held,
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}")
    print(f"{'claim of 10':<18}{'p50 ms':>9}{'p95 ms':>9}{'vs unlimited':>14}")
    for name, row in costs.items():
        print(
            f"{name:<18}{row['claim_ms_p50']:>9.3f}{row['claim_ms_p95']:>9.3f}"
            f"{row['claim_ratio_to_unlimited']:>14.2f}"
        )
    print(
        f"hold at {held['limit_per_second']}/s for {held['seconds']:g} s: reached "
        f"{held['rate_reached']}/s ({held['error_vs_limit']:+.1%}), most in any second "
        f"{held['most_in_any_second']}"
    )
    print(
        f"task hold at {task_held['limit_per_second']}/s for {task_held['seconds']:g} s: "
        f"reached {task_held['rate_reached']}/s ({task_held['error_vs_limit']:+.1%}), most in "
        f"any second {task_held['most_in_any_second']}, unlimited jobs done "
        f"{task_held['unlimited_done']} of {task_held['unlimited_backlog']}, row updates per "
        f"start {task_held['row_updates_per_start']}"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
