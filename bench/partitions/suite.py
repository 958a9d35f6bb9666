"""Retention by partition: dropping a day of history against deleting it in batches.

    python -m bench partitions [--dsn DSN] [--rows 5000000] [--days 5] [--batch-size 1000]
                               [--out DIR] [--short]

Two fresh schemas (pgqueue.migrate.apply, dropped afterwards), each given --rows finished jobs
spread evenly over --days days (bench/history/suite.py's fill: ids in time order, 10 queues, 90%
succeeded):
- partitioned: migrated as `pgqueue migrate` does, then history_partitions_step until each
  day the rows span has a partition, so each day is a table of its own;
- one table: migrated inside a transaction, which leaves the partitions to workers, and no
  worker runs: every row sits in the one default partition, as the whole history did before
  partitioning.
Then each prunes the oldest day as a worker's retention does (pgqueue.retention.prune, with
--batch-size rows per DELETE): the partitioned schema drops that day's table, the other
deletes its rows batch by batch. Recorded for each: the wall time, the rows gone, and the
history's dead tuples, size and live rows before and after (statistics flushed first).

Writes results.json to its results folder (bench/report.py) and prints a summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.history.suite import fill, table_state
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue.history.retention import Cutoff, prune


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "partitions",
        __doc__.split("\n\n")[0],
        short="the CI run: 50,000 rows over 3 days",
    )
    parser.add_argument("--rows", type=int, help="finished jobs in each schema (default 5000000)")
    parser.add_argument("--days", type=int, help="days they span (default 5)")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per DELETE (1000)")
    args = parser.parse_args(argv)
    options.sized(args, short={"rows": 50_000, "days": 3}, full={"rows": 5_000_000, "days": 5})
    options.positive(
        parser, {"--rows": args.rows, "--days": args.days, "--batch-size": args.batch_size}
    )
    return args


def _flushed_state(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """table_state once this session's statistics have reached the shared ones."""
    if conn.info.server_version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.0)  # the flush happens as this session goes idle
    return table_state(conn, schema)


def measure(dsn: str, schema: str, args: argparse.Namespace, partitioned: bool) -> dict[str, Any]:
    today = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    end = today + timedelta(days=args.days)  # the rows fill today and the days after it
    ident = sql.Identifier(schema)
    figures: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        if partitioned:  # a partition for each day the rows span
            steps = []
            while (step := conn.execute(
                sql.SQL("SELECT {}.history_partitions_step(%s, 5000)").format(ident),
                [args.days + 1],
            ).fetchone()[0]) is not None:  # fmt: skip
                steps.append(step)
            figures["upkeep_steps"] = steps
        figures["fill_s"] = round(fill(conn, schema, args.rows, args.days, end), 1)
        figures["partitions"] = conn.execute(
            "SELECT count(*) FROM pg_partition_tree(%s::regclass) WHERE isleaf",
            [f'"{schema}".job_history'],
        ).fetchone()[0]
        figures["before"] = _flushed_state(conn, schema)
        # Retention of days - 1, at the end of the last day: the cutoff falls at the end of the
        # oldest day, today, which is past it whole.
        cutoff = Cutoff(timedelta(days=args.days - 1), batch_size=args.batch_size)
        started = time.perf_counter()
        report = prune(conn, schema, cutoff, now=end)
        figures["prune_s"] = round(time.perf_counter() - started, 3)
        figures["partitions_dropped"] = [name for name, _ in report.partitions]
        figures["rows_deleted"] = report.deleted
        figures["delete_batches"] = report.batches
        figures["after"] = _flushed_state(conn, schema)
        figures["rows_gone"] = figures["before"]["rows"] - figures["after"]["rows"]
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("partitions", lambda: bench(Run("partitions", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        figures: dict[str, Any] = {"rows": args.rows, "days": args.days}
        for name, partitioned in (("partitioned", True), ("one_table", False)):
            with scratch_schema(server.dsn, f"bench_part_{name}", partitions=partitioned) as schema:
                figures[name] = measure(server.dsn, schema, args, partitioned)
        part, flat = figures["partitioned"], figures["one_table"]
        figures["prune_time_ratio"] = round(flat["prune_s"] / max(part["prune_s"], 1e-6), 1)
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}: {args.rows:,} finished jobs over {args.days} days")
    for name in ("partitioned", "one_table"):
        f = figures[name]
        how = (
            f"dropped {', '.join(f['partitions_dropped'])}"
            if f["partitions_dropped"]
            else f"deleted in {f['delete_batches']} batches"
        )
        print(
            f"{name:<12} oldest day ({f['rows_gone']:,} rows) {how} in {f['prune_s']:.2f} s; "
            f"dead tuples {f['before']['dead_estimate']:,} -> {f['after']['dead_estimate']:,}; "
            f"size {f['before']['total_mb']:,} -> {f['after']['total_mb']:,} MB"
        )
    print(f"the batched DELETE took {figures['prune_time_ratio']}x the drop")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
