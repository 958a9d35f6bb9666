"""What each claim and scan of a worker walks while a long transaction holds the horizon.

    python -m bench.degradation.walks [--dsn DSN] [--dead N] [--steps K] [--batch B]

On a fresh schema (dropped at the end) it parks a few scheduled jobs a day ahead, registers
one worker, holds a REPEATABLE READ snapshot on a connection of its own (after
`SELECT txid_current()`, as the degradation bench's long-runner does), then moves N jobs
through the real statements a worker runs: job_insert, job_claim_unkeyed from the hint (the
last position claimed) and job_finish_many, B at a time. Every such job leaves a dead entry in
jobs_claim_idx and jobs_running_idx (and a dead heap tuple) that nothing may remove while the
snapshot is held. At 0 dead and after each of K steps up to N it leaves a live end of 100
queued jobs and 10 running ones (and from the start 10 running jobs of a worker whose row was
removed: orphans), then runs EXPLAIN (ANALYZE, BUFFERS) on each statement a
worker or its rescuer and maintenance run in a transaction that is rolled back, so nothing
moves: the shared buffers each touched and its time. The safety net's kinds read the
table's first SWEEP_PAGES pages, as a slice of pgqueue/worker/sweep.py does, and claim the
job just after the hint at its own position. A statement whose buffers grow with N
walks the dead entries. A statement's buffers are those of all its plan nodes, each counted
once (bench/plans.py own_buffers). Prints one table (kind, buffers and ms per step) and
writes nothing. Small enough for a 2-core machine: 300,000 jobs take about a minute.

With --fair the jobs moved through (and the live end) carry a fairness key and a vtime, and
are claimed with job_claim_fair from the fair hint, so the dead entries are the fair claim
index's: the fair kinds (from the hint, from the floor, the fair safety net's slice and its
claim of a job it found) are the ones to read then. With --analyze the jobs table's
statistics are taken again before each measurement, as autovacuum's ANALYZE does during a
run (the embedded server's autovacuum is on): a plan that changes with them shows here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.degradation.run import create_schema, drop_schema
from bench.plans import own_buffers
from bench.server import database
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params
from pgqueue.worker.sweep import SWEEP_FOUND, SWEEP_MIN_PAGES

QUEUE = "default"
FLOOR = (-32768, 0)
FAIR_FLOOR = (-32768, float("-inf"))
FAIR_CEILING = (32767, float("inf"))
CEILING = (32767, 2**63 - 1)
LIVE_QUEUED = 100
LIVE_RUNNING = 10
CLAIM_LIMIT = 10  # a worker's default concurrency: its largest claim
# The safety net's slice of the jobs table's pages (pgqueue/worker/sweep.py), from its start.
SWEEP_PAGES = SWEEP_MIN_PAGES


@dataclass(frozen=True)
class Kind:
    """One statement to measure: its name in the table, the named query, its parameters."""

    name: str
    query: str
    params: Callable[[State], dict[str, Any]]


@dataclass
class State:
    """Where the churn stands: the worker's id, the hint (last position claimed)."""

    worker_id: int
    hint: tuple[int, int] = FLOOR
    fair: bool = False  # the jobs moved through are fair (--fair)
    fair_hint: tuple[int, float] = FAIR_FLOOR
    vtime: float = 0.0  # the next fair job's
    live_vtime: float = 0.0  # the first queued fair job of the live end


def _claim(
    after: tuple[int, int],
    s: State,
    *,
    limit: int = CLAIM_LIMIT,
    before: tuple[int, int] = CEILING,
) -> dict[str, Any]:
    return {
        "queue": QUEUE,
        "after_priority": after[0],
        "after_id": after[1],
        "before_priority": before[0],
        "before_id": before[1],
        "limit": limit,
        "worker_id": s.worker_id,
        "now": None,
        "limited_tasks": [],
    }


def _fair(
    after: tuple[int, float],
    s: State,
    *,
    limit: int = CLAIM_LIMIT,
    before: tuple[int, float] = FAIR_CEILING,
) -> dict[str, Any]:
    return {
        "queue": QUEUE,
        "after_priority": after[0],
        "after_vtime": after[1],
        "before_priority": before[0],
        "before_vtime": before[1],
        "limit": limit,
        "worker_id": s.worker_id,
        "now": None,
    }


KINDS: list[Kind] = [
    Kind("hinted claim (unkeyed)", "job_claim_unkeyed", lambda s: _claim(s.hint, s)),
    Kind("floor claim (unkeyed)", "job_claim_unkeyed", lambda s: _claim(FLOOR, s)),
    Kind("floor claim (keyed)", "job_claim", lambda s: _claim(FLOOR, s)),
    Kind(
        f"safety net: a slice of {SWEEP_PAGES:,} pages",
        "job_sweep_find",
        lambda s: {
            "queue": QUEUE,
            "lo": "(0,0)",
            "hi": f"({SWEEP_PAGES},0)",
            "hint_priority": s.hint[0],
            "hint_id": s.hint[1],
            "limit": SWEEP_FOUND,
        },
    ),
    Kind(
        "safety net: claim of a job it found",
        "job_claim_unkeyed",
        lambda s: _claim((0, s.hint[1]), s, before=(0, s.hint[1] + 2), limit=1),
    ),
    Kind("fair claim (from vtime 0)", "job_claim_fair", lambda s: _fair((FLOOR[0], 0.0), s)),
    Kind("fair claim (from the hint)", "job_claim_fair", lambda s: _fair(s.fair_hint, s)),
    Kind("fair claim (from the floor)", "job_claim_fair", lambda s: _fair(FAIR_FLOOR, s)),
    Kind(
        f"fair safety net: a slice of {SWEEP_PAGES:,} pages",
        "job_sweep_find_fair",
        lambda s: {
            "queue": QUEUE,
            "lo": "(0,0)",
            "hi": f"({SWEEP_PAGES},0)",
            "hint_priority": s.fair_hint[0],
            "hint_vtime": s.fair_hint[1],
            "limit": SWEEP_FOUND,
        },
    ),
    Kind(
        "fair safety net: claim of a job it found",
        "job_claim_fair",
        lambda s: _fair((0, s.live_vtime), s, before=(0, s.live_vtime), limit=1),
    ),
    Kind(
        "promotion of due jobs",
        "job_promote_due",
        lambda s: {"queues": [QUEUE], "limit": 1000, "now": None},
    ),
    Kind(
        "rescuer: out-of-range jobs",
        "job_fail_out_of_range",
        lambda s: {"queues": [QUEUE], "limit": 1000, "now": None, "keep_history": True},
    ),
    Kind(
        "rescuer: stranded jobs",
        "job_find_stranded",
        lambda s: {"lease": 30.0, "limit": 1000, "now": None},
    ),
    Kind("rescuer: orphaned jobs", "job_find_orphaned", lambda s: {"limit": 1000}),
    Kind(
        "rescuer: dead workers",
        "worker_delete_dead",
        lambda s: {"lease": 30.0, "now": None},
    ),
    Kind(
        "history prune",
        "job_history_prune",
        lambda s: {
            "after": None,
            "limit": 1000,
            "now": None,
            "older_than": 7 * 86400.0,
            "queue": None,
            "statuses": None,
        },
    ),
    Kind(
        "history partitions step",
        "history_partitions_step",
        lambda s: {"ahead": 2, "lock_ms": 100},
    ),
    Kind("steps prune", "job_steps_prune", lambda s: {"after": None, "limit": 1000}),
    Kind(
        "periodic ticks prune",
        "periodic_tick_prune",
        lambda s: {"after": None, "limit": 1000, "now": None, "older_than": 86400.0},
    ),
    Kind("fairness starts fold", "fairness_starts_fold", lambda s: {"now": None}),
    Kind("fairness starts prune", "fairness_starts_prune", lambda s: {"now": None}),
    Kind(
        "cancel check (running ids)",
        "job_list_cancel_requested",
        lambda s: {"ids": [], "worker_id": s.worker_id},
    ),
]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.degradation.walks", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded server)")
    parser.add_argument("--dead", type=int, default=300_000, help="jobs moved through (300000)")
    parser.add_argument("--steps", type=int, default=3, help="measurements after 0 dead (3)")
    parser.add_argument("--batch", type=int, default=2000, help="jobs per insert/claim/finish")
    parser.add_argument("--fair", action="store_true", help="move fair jobs through instead")
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE the jobs table before each measurement, as autovacuum does during a run",
    )
    args = parser.parse_args(argv)
    for flag in ("dead", "steps", "batch"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be greater than 0, got {getattr(args, flag)}")
    return args


def _insert(conn: psycopg.Connection[Any], schema: str, n: int, **extra: Any) -> list[int]:
    job = {"queue": QUEUE, "task": "noop", "args": {}, "priority": 0, "max_attempts": 3}
    jobs = [job | extra] * n
    params = {"jobs": json.dumps(jobs), "now": None, "trace_context": None}
    return [row[0] for row in conn.execute(query("job_insert", schema), params).fetchall()]


def _insert_fair(conn: psycopg.Connection[Any], schema: str, s: State, n: int) -> None:
    """n fair jobs of one key, at the next vtimes."""
    job = {"queue": QUEUE, "task": "noop", "args": {}, "priority": 0, "max_attempts": 3}
    jobs = [job | {"fairness_key": "a", "vtime": s.vtime + i} for i in range(n)]
    s.vtime += n
    params = {"jobs": json.dumps(jobs), "now": None, "trace_context": None}
    conn.execute(query("job_insert", schema), params)


def _claim_ids(
    conn: psycopg.Connection[Any], schema: str, s: State, limit: int
) -> list[tuple[int, int, int]]:
    """(id, priority, attempt) of the jobs a hinted claim took; the hint moves past them."""
    if s.fair:
        rows = conn.execute(query("job_claim_fair", schema), _fair(s.fair_hint, s, limit=limit))
        fair = [(r[0], r[3], r[4], r[11]) for r in rows.fetchall() if r[0] is not None]
        if fair:
            s.fair_hint = max((p, v) for _, p, _, v in fair)
        return [(i, p, a) for i, p, a, _ in fair]
    rows = conn.execute(query("job_claim_unkeyed", schema), _claim(s.hint, s, limit=limit))
    got = [(r[0], r[3], r[4]) for r in rows.fetchall() if r[0] is not None]
    if got:
        s.hint = max((p, i) for i, p, _ in got)
    return got


def _finish(
    conn: psycopg.Connection[Any], schema: str, s: State, got: list[tuple[int, int, int]]
) -> None:
    rows = [
        {"id": i, "attempt": a, "worker_id": s.worker_id, "status": "succeeded"} for i, _, a in got
    ]
    conn.execute(query("job_finish_many", schema), finish_rows_params(rows, keyed=False))


def churn(conn: psycopg.Connection[Any], schema: str, s: State, n: int, batch: int) -> None:
    """Move n jobs through enqueue, a hinted claim and a finish, as a worker would."""
    left = n
    while left > 0:
        size = min(batch, left)
        if s.fair:
            _insert_fair(conn, schema, s, size)
        else:
            _insert(conn, schema, size)
        got = _claim_ids(conn, schema, s, size)
        _finish(conn, schema, s, got)
        left -= len(got)
        if not got:
            raise RuntimeError("the churn's claim found nothing it had just enqueued")


def live_end(conn: psycopg.Connection[Any], schema: str, s: State) -> None:
    """LIVE_QUEUED queued jobs after the hint, LIVE_RUNNING of them running."""
    if s.fair:
        _insert_fair(conn, schema, s, LIVE_QUEUED)
        s.live_vtime = s.vtime - LIVE_QUEUED + LIVE_RUNNING
    else:
        _insert(conn, schema, LIVE_QUEUED)
    _claim_ids(conn, schema, s, LIVE_RUNNING)


def explain(conn: psycopg.Connection[Any], schema: str, kind: Kind, s: State) -> tuple[int, float]:
    """Shared buffers touched and milliseconds of one run of `kind`, rolled back."""
    statement = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query(kind.query, schema)
    with conn.transaction(force_rollback=True):
        row = conn.execute(statement, kind.params(s)).fetchone()
    plan = row[0][0] if row else {}
    # Every node's own: the top node's count leaves out the CTEs nothing reads (the fair
    # claim's clock and start counts).
    buffers = sum(n for _, n in own_buffers(plan.get("Plan", {})))
    return buffers, float(plan.get("Execution Time", 0.0))


def measure(conn: psycopg.Connection[Any], schema: str, s: State) -> dict[str, tuple[int, float]]:
    """Each kind twice; the second run's figures (the first may read pages in)."""
    found = {}
    for kind in KINDS:
        explain(conn, schema, kind, s)
        found[kind.name] = explain(conn, schema, kind, s)
    return found


def setup(conn: psycopg.Connection[Any], schema: str) -> State:
    create_schema(conn, schema)
    conn.execute(query("session_prefer_indexes", schema))  # as the worker's own sessions
    row = conn.execute(
        query("worker_register", schema),
        {
            "name": "walks",
            "hostname": "bench",
            "pid": os.getpid(),
            "queues": [QUEUE],
            "concurrency": CLAIM_LIMIT,
            "client_pid": None,
        },
    ).fetchone()
    s = State(worker_id=int(row[0]) if row else 0)
    _insert(conn, schema, 100, delay=86400.0)  # scheduled a day ahead: promotion finds none
    conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
    _orphans(conn, schema)  # after ANALYZE: the statistics as in the runs before it existed
    return s


def _orphans(conn: psycopg.Connection[Any], schema: str) -> None:
    """10 running jobs of a worker whose row was removed: what the orphan look finds."""
    name = sql.Identifier(schema)
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
            " VALUES ('vanished', 'bench', 1, ARRAY[%s], 1) RETURNING id"
        ).format(name),
        [QUEUE],
    ).fetchone()
    vanished = int(row[0]) if row else 0
    ids = _insert(conn, schema, LIVE_RUNNING)
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s,"
            " started_at = now() WHERE id = ANY(%s)"
        ).format(name),
        [vanished, ids],
    )
    conn.execute(sql.SQL("DELETE FROM {}.workers WHERE id = %s").format(name), [vanished])


def walks(
    dsn: str, dead: int, steps: int, batch: int, fair: bool = False, analyze: bool = False
) -> list[tuple[int, dict[str, Any]]]:
    schema = f"bench_walks_{os.getpid()}"
    results: list[tuple[int, dict[str, Any]]] = []
    with (
        psycopg.connect(dsn, autocommit=True, application_name="bench:walks") as conn,
        psycopg.connect(dsn, application_name="bench:long-runner") as holder,
    ):
        try:
            s = setup(conn, schema)
            s.fair = fair
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT txid_current()")
            done = 0
            for step in range(steps + 1):
                target = dead * step // steps
                started = time.monotonic()
                churn(conn, schema, s, target - done, batch)
                done = target
                live_end(conn, schema, s)
                if analyze:
                    conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
                print(
                    f"walks: {done:,} dead ({time.monotonic() - started:.1f} s to churn)",
                    file=sys.stderr,
                )
                results.append((done, measure(conn, schema, s)))
                # The next churn claims from the hint: the live end is part of it.
        finally:
            holder.rollback()
            drop_schema(dsn, schema)
    return results


def table(results: list[tuple[int, dict[str, Any]]]) -> str:
    heads = [f"{n:,} dead" for n, _ in results]
    lines = [
        "| kind | " + " | ".join(f"{h}: buffers | ms" for h in heads) + " |",
        "|---|" + "---:|---:|" * len(heads),
    ]
    for kind in KINDS:
        cells = [f"{r[kind.name][0]:,} | {r[kind.name][1]:.2f}" for _, r in results]
        lines.append(f"| {kind.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with database(options.dsn(args.dsn)) as server:
        results = walks(server.dsn, args.dead, args.steps, args.batch, args.fair, args.analyze)
        moved = "fair jobs" if args.fair else "jobs"
        print(
            f"PostgreSQL {server.version}, {CLAIM_LIMIT}-job claims, {moved} moved through,"
            " hint at the live end"
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
