"""What each job's lifecycle costs the server, counted: statements, transactions, rows,
index entries and WAL per 1,000 jobs.

    python -m bench lifecycle [--dsn DSN] [--jobs 10000] [--short] [--out DIR]

Times would be noise on a shared machine; these counts are not. Without a DSN it starts the
embedded PostgreSQL with pg_stat_statements preloaded and autovacuum off (nothing but the
phase writes); a server at --dsn is used as it is, and what it cannot count is listed under
`missing` in the results. Each scenario runs in a fresh schema of the bench's own database,
after one empty burst worker has made the history's partitions:

- `one_c10`: --jobs enqueued one per transaction, then drained by one real worker process
  (`pgqueue worker --burst`) at concurrency 10;
- `bulk_c100`: --jobs enqueued by enqueue_many in batches of 1,000, drained at concurrency 100;
- `bound_b10`, `bound_b100`: the same bulk enqueue, drained by the bare lifecycle SQL of
  bench/throughput/pgbench/lease_finish.sql (claim a batch, then finish it: two
  transactions), 10 and 100 jobs a claim.

Each phase (an enqueue or a drain) starts after a CHECKPOINT, so its full-page images are its
own first touches of each page, and is counted by bench/lifecycle/counters.py; its wall time
and the CPU seconds of the client (the worker process, or the bench itself) and of the whole
server are read by bench/lifecycle/cpu.py. pg_stat_wal counts the whole server's WAL: on a
server others use at the same time, read the WAL records of the bench's own tables
(pg_walinspect) instead. Writes results.json and results.md to its results folder
(bench/report.py).
"""

from __future__ import annotations

import argparse
import difflib
import random
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.lifecycle import counters, cpu, tables
from bench.lifecycle.app import TASK
from bench.report import Run, guarded
from bench.server import database, scratch_database, scratch_schema
from pgqueue import Queue
from pgqueue.queries import _raw_queries, query

ROOT = Path(__file__).resolve().parents[2]
BOUND = ROOT / "bench" / "throughput" / "pgbench" / "lease_finish.sql"
# The embedded server's settings: statements counted, and no autovacuum writing mid-phase.
CONFIGURE = {"shared_preload_libraries": "pg_stat_statements", "autovacuum": "off"}
SCENARIOS = ("one_c10", "bulk_c100", "bound_b10", "bound_b100")
BULK_BATCH = 1000


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser("lifecycle", __doc__.split("\n\n")[0], short="500 jobs a scenario")
    parser.add_argument("--jobs", type=int, help="jobs per scenario (default 10000)")
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}"
    )
    args = parser.parse_args(argv)
    options.sized(args, {"jobs": 500}, {"jobs": 10_000})
    options.positive(parser, {"--jobs": args.jobs})
    args.scenarios = options.choices(parser, "--scenarios", args.scenarios, SCENARIOS)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("lifecycle", lambda: bench(Run("lifecycle", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn), configure=CONFIGURE) as server:
        out = run.folder(server)
        with scratch_database(server.dsn, "bench_lifecycle") as dsn:
            figures = measure(dsn, args.jobs, args.scenarios)
        run.write(out, "results.json", server, figures)
        (out / "results.md").write_text(tables.markdown(run.header(server) | figures))
        print((out / "results.md").read_text())
    return 0


def measure(dsn: str, jobs: int, scenarios: Sequence[str]) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, application_name="bench-lifecycle") as conn:
        found = counters.sources(conn)
        if cpu.postmaster_of(conn) is None:
            found.missing.append("the server's processes (not on this machine): no server CPU")
        results = {name: scenario(conn, dsn, name, jobs, found) for name in scenarios}
    return {
        "jobs": jobs,
        "counted": {
            "statements": "pg_stat_statements" if found.statements else None,
            "wal_records": "pg_walinspect" if found.walinspect else None,
            "index_inserts": (
                "B-tree WAL records that add a leaf entry (INSERT_LEAF, INSERT_POST, SPLIT_L, "
                "SPLIT_R), per index, read with pg_walinspect"
                if found.walinspect
                else None
            ),
        },
        "missing": found.missing,
        "scenarios": results,
    }


def scenario(
    conn: psycopg.Connection[Any], dsn: str, name: str, jobs: int, found: counters.Sources
) -> dict[str, Any]:
    kind, size = name.split("_")
    with scratch_schema(dsn, "bench_lifecycle") as schema:
        # Makes the history's partitions, outside any phase; its CPU, with no job to run, is
        # what a worker's start and stop cost both sides, taken out of the drains' per job.
        idle = cpu.Clock(cpu.postmaster_of(conn)).start()
        _worker(dsn, schema, 1)
        start_stop = idle.stop()
        enqueue = _enqueue_one if kind == "one" else _enqueue_bulk
        phases: dict[str, Callable[[], None]] = {
            "enqueue": lambda: enqueue(dsn, schema, jobs),
            "drain": (
                (lambda: _worker(dsn, schema, int(size[1:])))
                if kind != "bound"
                else (lambda: _bound(dsn, schema, int(size[1:])))
            ),
        }
        result: dict[str, Any] = {}
        names = _named(schema)
        postmaster = cpu.postmaster_of(conn)
        for phase, action in phases.items():
            start = counters.before(conn, schema, found)
            clock = cpu.Clock(postmaster).start()
            action()
            spent = clock.stop()
            if phase == "drain" and kind != "bound":
                spent["start_stop"] = start_stop
            cost = counters.after(conn, schema, start, found) | {"cpu": spent}
            for statement in cost.get("statements", []):
                statement["name"] = _name(statement["query"], names)
            result[phase] = cost
        done = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status = 'succeeded'").format(
                sql.Identifier(schema, "job_history")
            )
        ).fetchone()
        if not done or done[0] != jobs:
            raise RuntimeError(f"{name}: {done[0] if done else 0} of {jobs} jobs succeeded")
        result["per_job_indexes"] = _indexes(conn, schema)
    print(f"bench lifecycle: {name} done", file=sys.stderr)
    return result


def _queue(dsn: str, schema: str) -> tuple[Queue, Any]:
    queue = Queue(dsn, schema=schema)
    return queue, queue.declare(TASK)


def _enqueue_one(dsn: str, schema: str, jobs: int) -> None:
    queue, task = _queue(dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for seq in range(jobs):
            queue.enqueue(task.job(seq=seq), conn=conn)


def _enqueue_bulk(dsn: str, schema: str, jobs: int) -> None:
    queue, task = _queue(dsn, schema)
    with psycopg.connect(dsn) as conn:
        for first in range(0, jobs, BULK_BATCH):
            last = min(first + BULK_BATCH, jobs)
            queue.enqueue_many([task.job(seq=seq) for seq in range(first, last)], conn=conn)
            conn.commit()


def _worker(dsn: str, schema: str, concurrency: int) -> None:
    """One real worker process that drains the queue and exits (--burst)."""
    command = [sys.executable, "-m", "pgqueue", "worker", "bench.lifecycle.app:queue"]
    command += ["--dsn", dsn, "--schema", schema, "--concurrency", str(concurrency)]
    command += ["--burst", "--no-periodic", "--log-level", "warning"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the worker failed ({done.returncode}): {done.stderr[-2000:]}")


def _bound_sql() -> tuple[str, str]:
    """lease_finish.sql's claim and finish, with psycopg's named parameters."""
    text = "\n".join(
        line for line in BOUND.read_text().splitlines() if not line.startswith(("--", "\\"))
    )
    claim, finish = (
        re.sub(r":(worker|batch)\b", r"%(\1)s", part).strip()
        for part in text.split(";")
        if part.strip()
    )
    return claim, finish


def _bound(dsn: str, schema: str, batch: int) -> None:
    """lease_finish.sql's two statements, each its own transaction, until nothing is left."""
    claim, finish = _bound_sql()
    with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
        while True:
            params = {"worker": random.randint(1, 1_000_000_000), "batch": batch}
            if conn.execute(claim.encode(), params).rowcount == 0:
                return
            conn.execute(finish.encode(), params)


def _indexes(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[str]]:
    """The indexes each table of the job's path keeps, as the scenario left them."""
    rows = conn.execute(
        "SELECT t.relname, i.relname FROM pg_index AS x"
        " JOIN pg_class AS i ON i.oid = x.indexrelid JOIN pg_class AS t ON t.oid = x.indrelid"
        " JOIN pg_namespace AS n ON n.oid = t.relnamespace"
        " WHERE n.nspname = %s AND t.relkind = 'r' ORDER BY 1, 2",
        [schema],
    ).fetchall()
    found: dict[str, list[str]] = {}
    for table, index in rows:
        found.setdefault(str(table), []).append(str(index))
    return found


def _key(text: str) -> str:
    """A statement's words, without literals, parameters, numbers or spacing: the same for
    a query as pgqueue sends it and as pg_stat_statements normalises it (which also makes
    parameters of NULL, true, false and extract's field)."""
    text = re.sub(r"'(?:[^']|'')*'", "", text)
    text = re.sub(r"%\(\w+\)s|\$\d+|\b(?:null|true|false|epoch)\b", "", text, flags=re.I)
    return re.sub(r"[^A-Za-z_]+", "", re.sub(r"\b\d+\b", "", text)).lower()


def _name(text: str, names: dict[str, str]) -> str | None:
    """The named query `text` is, if any: its words match, or nearly (pg_stat_statements
    also replaces keywords that parse as constants, such as extract's field)."""
    key = _key(text)
    if key in names:
        return names[key]
    close = difflib.get_close_matches(key, list(names), n=1, cutoff=0.97)
    return names[close[0]] if close else None


def _named(schema: str) -> dict[str, str]:
    names = {}
    for name in _raw_queries():
        try:
            text = query(name, schema).as_string(None)
        except (KeyError, IndexError, ValueError):
            continue
        names[_key(text)] = name
    # A bare transaction statement is named after itself, not after whichever query file
    # happens to hold the same one word: BEGIN and COMMIT come from many callers.
    for word in ("begin", "commit", "rollback"):
        names[word] = word.upper()
    claim, finish = _bound_sql()
    return names | {_key(claim): "lease_finish.sql claim", _key(finish): "lease_finish.sql finish"}
