"""Rate limits: what the limit costs a claim, and whether a limited queue holds its rate.

    python -m bench rates [--dsn DSN] [--jobs 20000] [--rate 50] [--seconds 60] [--workers 2]
                          [--out DIR] [--short]

- `cost`: schemas of --jobs queued no-op jobs each, drained by one connection in batches of
  10, taking turns claim by claim: `unlimited` (job_claim_unkeyed, a queue without keys or
  limit), `keyed_statement` (job_claim, which the rated claim is built on), and
  `rated_N` (job_claim_rated under a limit of N starts per window that it never reaches at
  this pace, so every claim pays the full bookkeeping: the lock, the count, the record of
  the N most recent starts).
- `hold`: --workers worker processes (`pgqueue worker`, concurrency 20 each) drain a backlog
  far larger than the limit allows, on a queue limited to --rate starts a second, for
  --seconds. From the jobs' started_at (the times the limit records): the rate reached, its
  error against the limit, and the most starts in any one-second window.

Writes results.json to its results folder (bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from bench.workflows import Drain, fill, workers
from pgqueue import Queue
from pgqueue.queries import query

# The cost scenarios' limits, (starts, per seconds): far above what one connection claims, so
# that they never bind, with 100 and 10,000 recent starts to keep and rewrite.
RATED = ((100, 0.001), (10_000, 0.1))


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
    def __init__(self, dsn: str, schema: str, statement: str) -> None:
        super().__init__(dsn, schema)
        self.claim = query(statement, schema)


def cost(dsn: str, jobs: int) -> dict[str, Any]:
    import random

    with contextlib.ExitStack() as stack:
        drains: dict[str, Drain] = {}
        scenarios: list[tuple[str, str, tuple[int, float] | None]] = [
            ("unlimited", "job_claim_unkeyed", None),
            ("keyed_statement", "job_claim", None),
        ]
        scenarios += [(f"rated_{n}", "job_claim_rated", (n, per)) for n, per in RATED]
        for name, statement, limit in scenarios:
            schema = stack.enter_context(scratch_schema(dsn, "bench_rates"))
            fill(dsn, schema, jobs, chained=False)
            if limit is not None:
                Queue(dsn, schema=schema).set_rate_limit("default", limit[0], per=limit[1])
            drains[name] = RatedDrain(dsn, schema, statement)
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("rates", lambda: bench(Run("rates", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        costs = cost(server.dsn, args.jobs)
        held = hold(server.dsn, args.rate, args.seconds, args.workers)
        figures = {"batch": 10, "jobs": args.jobs, "cost": costs, "hold": held}
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
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
