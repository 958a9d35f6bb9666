"""History at scale: prune and read timings with `--rows` finished jobs.

    python -m bench history [--dsn DSN] [--rows N] [--days D] [--samples N]
                            [--batch-size N] [--out DIR] [--short]

Fills job_history of a fresh schema (made by pgqueue.migrate.apply, dropped afterwards) with
--rows finished jobs spread evenly over the last --days days (ids in time order, as a queue
writes them; 10 queues of uneven size; 90% succeeded, 8% failed, 2% cancelled), then:

1. times the history reads that matter, --samples random instances of each, first with the
   indexes of migration 0001 only (the primary key and finished_at) and then with
   job_history_queue_status_idx (queue, status, finished_at, id), and records each plan's
   access path;
2. times archiving (the INSERT into job_history that every finished job costs, in batches
   of 100 rows, as job_finish_many writes them) with that index against a copy of the table
   without it, batch for batch in turn;
3. prunes as pgqueue.retention does, batch by batch: first one day of the oldest history
   (the daily steady state of a 29-day retention), then everything older than 7 days (the
   first prune after retention is turned on), recording each batch's time, then VACUUM.

Writes results.json (and prune_batches.png) to its results folder (bench/report.py) and
prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database
from pgqueue.history.retention import Cutoff, PruneReport, prune
from pgqueue.migrate import apply
from pgqueue.queries import query

QUEUES = [f"q{n}" for n in range(10)]  # q0 holds about half the rows, q9 about 0.1%
INDEX = "job_history_queue_status_idx"
COLUMNS = (
    "id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,"
    " started_at, finished_at, worker_id, errors, result"
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "history", __doc__.splitlines()[0], short="the CI run: 20000 rows, 20 samples"
    )
    parser.add_argument("--rows", type=int, help="finished jobs in history (default 1000000)")
    parser.add_argument("--days", type=int, default=30, help="days they span (default 30)")
    parser.add_argument("--samples", type=int, help="timed runs of each read (default 200)")
    parser.add_argument("--batch-size", type=int, default=1000, help="prune batch (default 1000)")
    args = parser.parse_args(argv)
    args.rows = args.rows or (20_000 if args.short else 1_000_000)
    args.samples = args.samples or (20 if args.short else 200)
    for name in ("rows", "days", "samples", "batch_size"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be greater than 0")
    if args.days <= 8:
        parser.error("--days must be more than 8: the bench prunes what is older than 7 days")
    args.run = Run("history", argv, args.out, args.short)
    args.dsn = options.dsn(args.dsn)
    return args


# -- filling ---------------------------------------------------------------------------------


def fill(conn: psycopg.Connection[Any], schema: str, rows: int, days: int, now: datetime) -> float:
    """Insert `rows` finished jobs, oldest first, in chunks; returns the seconds it took."""
    started = time.perf_counter()
    chunk = 100_000
    for first in range(0, rows, chunk):
        count = min(chunk, rows - first)
        conn.execute(
            sql.SQL(
                """
            INSERT INTO {schema}.job_history
                (id, queue, task, args, status, priority, attempt, max_attempts, run_at,
                 created_at, started_at, finished_at, worker_id, errors, result)
            SELECT g.id,
                   'q' || least(9, floor(-ln(1.0 - random() * 0.999) / ln(2.0))::int),
                   'app.tasks.send_email',
                   jsonb_build_object('user_id', g.id, 'template', 'welcome'),
                   s.status, 0, s.attempt, 25, f.at - interval '2 s', f.at - interval '2 s',
                   f.at - interval '1 s', f.at, 1 + g.id %% 8,
                   CASE WHEN s.status = 'failed' THEN jsonb_build_array(jsonb_build_object(
                       'attempt', 1, 'error', 'ValueError: boom', 'traceback', ''))
                        ELSE '[]'::jsonb END,
                   CASE WHEN s.status = 'succeeded' THEN '"sent"'::jsonb END
            FROM generate_series(%(first)s + 1, %(first)s + %(count)s) AS g(id)
            CROSS JOIN LATERAL (
                SELECT %(start)s::timestamptz
                       + (%(span)s::double precision * g.id / %(rows)s) * interval '1 s' AS at
            ) AS f
            CROSS JOIN LATERAL (
                SELECT CASE WHEN r < 0.90 THEN 'succeeded' WHEN r < 0.98 THEN 'failed'
                            ELSE 'cancelled' END AS status,
                       CASE WHEN r < 0.90 THEN 1 ELSE 3 END AS attempt
                FROM (SELECT random() + g.id * 0 AS r) AS x
            ) AS s
            """
            ).format(schema=sql.Identifier(schema)),
            {
                "first": first,
                "count": count,
                "start": now - timedelta(days=days),
                "span": days * 86400.0,
                "rows": rows,
            },
        )
        conn.commit()
    conn.execute(sql.SQL("VACUUM ANALYZE {}.job_history").format(sql.Identifier(schema)))
    return time.perf_counter() - started


# -- reads -----------------------------------------------------------------------------------


def reads(schema: str, rows: int, days: int, now: datetime) -> dict[str, tuple[Any, Callable]]:
    """Each read as (statement, a function of rng -> parameters)."""
    ident = sql.Identifier(schema)
    start = now - timedelta(days=days)

    def moment(rng: random.Random) -> datetime:
        return start + timedelta(seconds=rng.uniform(3600, days * 86400))

    def page(status: str, queue: Callable[[random.Random], str]) -> Callable:
        return lambda rng: {"queue": queue(rng), "status": status, "before": moment(rng)}

    def common_queue(rng: random.Random) -> str:
        return "q0"

    def rare_queue(rng: random.Random) -> str:
        return "q7"

    by_page = sql.SQL(
        f"SELECT {COLUMNS} FROM {{}}.job_history"
        " WHERE queue = %(queue)s AND status = %(status)s AND finished_at < %(before)s"
        " ORDER BY finished_at DESC, id DESC LIMIT 50"
    ).format(ident)
    return {
        "by_id (job_get)": (
            query("job_get", schema),
            lambda rng: {"id": rng.randint(1, rows)},
        ),
        "finished_at range, 1 h page of 100": (
            sql.SQL(
                f"SELECT {COLUMNS} FROM {{}}.job_history"
                " WHERE finished_at >= %(at)s AND finished_at < %(at)s + interval '1 hour'"
                " ORDER BY finished_at LIMIT 100"
            ).format(ident),
            lambda rng: {"at": moment(rng) - timedelta(hours=1)},
        ),
        "finished_at range, count of 1 day": (
            sql.SQL(
                "SELECT count(*) FROM {}.job_history"
                " WHERE finished_at >= %(at)s AND finished_at < %(at)s + interval '1 day'"
            ).format(ident),
            lambda rng: {"at": moment(rng) - timedelta(days=1)},
        ),
        "queue+status page of 50: q0 succeeded (45%)": (
            by_page,
            page("succeeded", common_queue),
        ),
        "queue+status page of 50: q0 failed (4%)": (by_page, page("failed", common_queue)),
        "queue+status page of 50: q7 failed (0.03%)": (by_page, page("failed", rare_queue)),
        "queue+status page of 50: q7 cancelled (0.008%)": (
            by_page,
            page("cancelled", rare_queue),
        ),
    }


def time_reads(dsn: str, schema: str, rows: int, days: int, now: datetime, samples: int) -> Any:
    """Each read `samples` times as an unprepared statement, planned for its parameters every
    time (`custom`), and as a prepared one (`prepared`: after five runs PostgreSQL may switch to
    a generic plan, which cannot know how rare the queue and status asked for are). A fresh
    connection each call, so no plan is carried over from another phase."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return _time_reads(conn, schema, rows, days, now, samples)


def _time_reads(
    conn: psycopg.Connection[Any], schema: str, rows: int, days: int, now: datetime, samples: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (statement, params) in reads(schema, rows, days, now).items():
        out[name] = {"plan": explain(conn, statement, params(random.Random(name)))}
        for mode in ("custom", "prepared"):
            rng = random.Random(name)
            times = []
            for _ in range(samples):
                values = params(rng)
                started = time.perf_counter()
                conn.execute(statement, values, prepare=mode == "prepared").fetchall()
                times.append((time.perf_counter() - started) * 1000)
            out[name][mode] = summary_ms(times)
    return out


def explain(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> str:
    """The plan's access paths, e.g. 'Index Scan Backward using job_history_finished_idx'."""
    rows = conn.execute(sql.SQL("EXPLAIN ") + statement, params).fetchall()
    paths = []
    for (line,) in rows:
        text = line.strip().removeprefix("->  ")
        if "Scan" in text:
            paths.append(text.split("  (")[0])
    return "; ".join(paths)


def summary_ms(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1 if len(ordered) > 1 else 0], 3),
        "max_ms": round(ordered[-1], 3),
        "n": len(ordered),
    }


# -- archiving -------------------------------------------------------------------------------


def clone_without_index(conn: psycopg.Connection[Any], schema: str) -> None:
    """history_plain: a copy of job_history with only the indexes of migration 0001."""
    ident = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {0}.history_plain (LIKE {0}.job_history INCLUDING DEFAULTS);"
            " INSERT INTO {0}.history_plain SELECT * FROM {0}.job_history;"
            " ALTER TABLE {0}.history_plain ADD PRIMARY KEY (id);"
            " CREATE INDEX ON {0}.history_plain (finished_at);"
        ).format(ident)
    )
    conn.execute(sql.SQL("VACUUM ANALYZE {}.history_plain").format(ident))


def time_archive(conn: psycopg.Connection[Any], schema: str, now: datetime) -> dict[str, Any]:
    """Archiving into job_history (with the index) against history_plain (without), batch
    for batch in turn, so both see the same machine: 300 inserts of 100 rows each (after 20
    unmeasured), each its own transaction, as completions archive finished jobs. Commits do
    not wait for the WAL flush here, so the figure is the insert's own work, not the disk's."""
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("CHECKPOINT")  # so earlier bulk writes do not flush during the timing
    ident = sql.Identifier(schema)
    top = conn.execute(sql.SQL("SELECT max(id) FROM {}.job_history").format(ident)).fetchone()
    first_id = next_id = (top[0] if top and top[0] else 0) + 1
    warmup, batches, size = 20, 300, 100
    times: dict[str, list[float]] = {"job_history": [], "history_plain": []}
    for n in range(warmup + batches):
        for table, spent in times.items():
            started = time.perf_counter()
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit = off")
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {}.{} (id, queue, task, args, status, priority, attempt,"
                        " max_attempts, run_at, created_at, started_at, finished_at, result)"
                        " SELECT g, 'q' || (g %% 10), 'app.tasks.send_email',"
                        " jsonb_build_object('user_id', g), 'succeeded', 0, 1, 25,"
                        " %(now)s, %(now)s, %(now)s, %(now)s, '\"sent\"'"
                        " FROM generate_series(%(first)s::bigint,"
                        " %(first)s::bigint + %(size)s::int - 1) AS g"
                    ).format(ident, sql.Identifier(table)),
                    {"first": next_id, "size": size, "now": now},
                )
            if n >= warmup:
                spent.append(time.perf_counter() - started)
        next_id += size
    for table in times:
        conn.execute(
            sql.SQL("DELETE FROM {}.{} WHERE id >= %s").format(ident, sql.Identifier(table)),
            [first_id],
        )
    with_index, without = (
        {"rows_per_s": round(batches * size / sum(t)), **summary_ms([x * 1000 for x in t])}
        for t in times.values()
    )
    return {
        "with_index": with_index,
        "without_index": without,
        "time_ratio_with_over_without": round(
            sum(times["job_history"]) / sum(times["history_plain"]), 3
        ),
    }


# -- pruning ---------------------------------------------------------------------------------


def time_prune(
    dsn: str, schema: str, older_than: timedelta, batch: int, now: datetime
) -> tuple[PruneReport, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        report = prune(conn, schema, Cutoff(older_than, batch_size=batch), now=now)
        return report, time.perf_counter() - started


def prune_summary(report: PruneReport, wall: float) -> dict[str, Any]:
    history = report.batch_seconds[: max(1, report.batches - 1)]  # the last is the ticks batch
    return {
        "deleted": report.deleted,
        "batches": report.batches,
        "total_s": round(wall, 2),
        "rows_per_s": round(report.deleted / wall) if wall else None,
        "batch": summary_ms([t * 1000 for t in history]),
    }


def table_state(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """The history's rows, dead tuples and sizes, summed over its partitions."""
    row = conn.execute(
        "SELECT coalesce(sum(s.n_dead_tup), 0)::bigint,"
        " coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint,"
        " coalesce(sum(pg_indexes_size(s.relid)), 0)::bigint"
        " FROM pg_partition_tree(%s::regclass) AS t"
        " JOIN pg_stat_user_tables AS s ON s.relid = t.relid WHERE t.isleaf",
        [f'"{schema}".job_history'],
    ).fetchone()
    assert row is not None
    live = conn.execute(
        sql.SQL("SELECT count(*) FROM {}.job_history").format(sql.Identifier(schema))
    ).fetchone()
    return {
        "rows": live[0] if live else None,
        "dead_estimate": row[0],
        "total_mb": row[1] >> 20,
        "indexes_mb": row[2] >> 20,
    }


# -- the whole bench -------------------------------------------------------------------------


def run(args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    schema = f"bench_history_{os.getpid()}"
    now = datetime.now(timezone.utc).replace(microsecond=0)
    ident = sql.Identifier(schema)
    results: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as admin:
        apply(admin, schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            results["fill_s"] = round(fill(conn, schema, args.rows, args.days, now), 1)
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}.{}").format(ident, sql.Identifier(INDEX)))
            conn.commit()
            results["table_before"] = table_state(conn, schema)
            results["reads_without_index"] = time_reads(
                dsn, schema, args.rows, args.days, now, args.samples
            )
            started = time.perf_counter()
            conn.execute(
                sql.SQL(
                    "CREATE INDEX {} ON {}.job_history (queue, status, finished_at, id)"
                ).format(sql.Identifier(INDEX), ident)
            )
            conn.execute(sql.SQL("ANALYZE {}.job_history").format(ident))
            conn.commit()
            results["index_build_s"] = round(time.perf_counter() - started, 2)
            results["reads_with_index"] = time_reads(
                dsn, schema, args.rows, args.days, now, args.samples
            )
            clone_without_index(conn, schema)
            results["archive"] = time_archive(conn, schema, now)
            results["table_with_index"] = table_state(conn, schema)
        daily, daily_wall = time_prune(
            dsn, schema, timedelta(days=args.days - 1), args.batch_size, now
        )
        results["prune_one_day"] = prune_summary(daily, daily_wall)
        backlog, backlog_wall = time_prune(dsn, schema, timedelta(days=7), args.batch_size, now)
        results["prune_backlog_to_7_days"] = prune_summary(backlog, backlog_wall)
        results["prune_batch_seconds"] = [round(s, 5) for s in backlog.batch_seconds]
        with psycopg.connect(dsn, autocommit=True) as conn:
            results["table_after_prune"] = table_state(conn, schema)
            with conn.cursor() as cur:
                cur.execute("SET statement_timeout = 0")
            started = time.perf_counter()
            conn.execute(sql.SQL("VACUUM {}.job_history").format(ident))
            results["vacuum_after_prune_s"] = round(time.perf_counter() - started, 2)
            conn.execute(sql.SQL("ANALYZE {}.job_history").format(ident))
            results["reads_after_prune"] = time_reads(
                dsn, schema, args.rows, args.days, now, args.samples
            )
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
    return results


def chart(out: Path, batch_seconds: list[float], title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib missing, no chart (pip install -e '.[bench]')", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([s * 1000 for s in batch_seconds[:-1]], linewidth=0.8)
    ax.set_xlabel("batch")
    ax.set_ylabel("ms")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "prune_batches.png", dpi=110)
    plt.close(fig)


def print_summary(results: dict[str, Any]) -> None:
    print(f"fill {results['fill_s']} s; table {results['table_before']}")
    print(f"{'read (p50 / p95 ms)':46} {'custom, 0001':>15} {'+ index':>15} {'prepared':>15}")
    for name, without in results["reads_without_index"].items():
        with_ = results["reads_with_index"][name]

        def cell(d: dict[str, Any]) -> str:
            return f"{d['p50_ms']:>6.2f} /{d['p95_ms']:>7.2f}"

        print(
            f"{name:46} {cell(without['custom'])} {cell(with_['custom'])} {cell(with_['prepared'])}"
        )
    archive = results["archive"]
    print(
        f"archive: {archive['with_index']['rows_per_s']} rows/s with the index,"
        f" {archive['without_index']['rows_per_s']} without;"
        f" time ratio {archive['time_ratio_with_over_without']}"
    )
    for key in ("prune_one_day", "prune_backlog_to_7_days"):
        p = results[key]
        print(
            f"{key}: {p['deleted']} rows in {p['batches']} batches, {p['total_s']} s"
            f" ({p['rows_per_s']} rows/s); batch p50 {p['batch']['p50_ms']} ms,"
            f" p95 {p['batch']['p95_ms']} ms, max {p['batch']['max_ms']} ms"
        )
    print(f"vacuum after prune {results['vacuum_after_prune_s']} s")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded("history", lambda: bench(args))


def bench(args: argparse.Namespace) -> int:
    with database(args.dsn) as server:
        out = args.run.folder(server)
        results = run(args, server.dsn)
        figures = {
            "rows": args.rows,
            "days": args.days,
            "samples": args.samples,
            "batch_size": args.batch_size,
            **results,
        }
        args.run.write(out, "results.json", server, figures)
    title = (
        f"prune of {results['prune_backlog_to_7_days']['deleted']:,} rows in batches of "
        f"{args.batch_size}, PostgreSQL {server.version}"
    )
    chart(out, results["prune_batch_seconds"], title)
    print_summary(results)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
