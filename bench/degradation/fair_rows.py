"""What a fair claim from its hint reads while a long transaction holds the horizon, with every
row it reads written as a real run writes it.

    python -m bench.degradation.fair_rows [--dsn DSN] [--jobs N] [--steps K] [--keys 100]
        [--rate 3000] [--sample CLAIMS] [--no-hold]

walks.py --fair moves fair jobs of one key through the claim, stamped by hand, as fast as it
can: the rows the fair claim writes besides the jobs (the start counts per key and bucket,
the queue's clock log) take a few rewrites each, where a run at 3,000 jobs/s gives them
hundreds a bucket. Here, on a fresh schema (dropped at the end) with a REPEATABLE READ
snapshot held on a connection of its own, N jobs go through what the degradation bench's
producer and two workers run: the real enqueue (fairness_stamp_lock, fairness_stamp,
job_insert and the catch-up at commit) of a tick's jobs at a time, round-robin over --keys
fairness keys; job_claim_fair of at most 10 jobs from each worker's hint (the highest
position its claims had reached before the last one), the two workers in turn;
job_finish_many; and every 10 s of the clock the sweep's fold and prunes. The claims pass an
injected now that moves at --rate jobs a second, so each row keyed by time takes the
rewrites a run at that rate gives it, whatever the speed here.

At 0 and after each of K steps up to N, the next --sample claims run with auto_explain
(ANALYZE, BUFFERS) and each plan node's own shared buffers (bench/plans.py own_buffers)
are averaged per claim and summed by node: what each relation and index costs a claim.
Prints one table (node, buffers a claim per step) and writes nothing. --no-hold holds no
snapshot: the control.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.degradation.run import drop_schema
from bench.degradation.walks import CLAIM_LIMIT, QUEUE, State, _fair, setup
from bench.plans import own_buffers
from bench.server import database
from pgqueue.errors import PgQueueError
from pgqueue.models import JobOptions, NewJob
from pgqueue.queries import query
from pgqueue.store.fairness import FAIR_FLOOR
from pgqueue.store.jobs import enqueue_plan, finish_rows_params
from pgqueue.store.plan import run

TICK_JOBS = 30  # the producer's enqueue per 10 ms tick at 3,000 jobs/s
WORKERS = 2  # the degradation bench's
PRUNE_SECONDS = 10.0  # the rescuer's interval, which runs the sweep's prunes
TOTAL = "all nodes"


@dataclass
class Hint:
    """One worker's fair hint, as pgqueue/worker/fair.py moves it."""

    worker_id: int
    after: tuple[int, float] | None = None
    reached: tuple[int, float] | None = None

    def moved(self, top: tuple[int, float] | None) -> None:
        self.after = self.reached
        if top is not None:
            self.reached = top if self.reached is None else max(self.reached, top)


@dataclass
class Churn:
    """Where the run stands: the workers' hints, jobs moved, the injected clock."""

    hints: list[Hint]
    start: datetime
    rate: float
    keys: int
    moved: int = 0
    claims: int = 0
    pruned_at: float = 0.0
    plans: list[dict[str, Any]] = field(default_factory=list)
    sampling: bool = False  # auto_explain is on
    claiming: bool = False  # the notice now is a fair claim's plan

    @property
    def seconds(self) -> float:
        return self.moved / self.rate

    @property
    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.seconds)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.degradation.fair_rows", description=__doc__
    )
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded server)")
    parser.add_argument("--jobs", type=int, default=360_000, help="jobs moved through (360000)")
    parser.add_argument("--steps", type=int, default=3, help="measurements after 0 (3)")
    parser.add_argument("--keys", type=int, default=100, help="fairness keys, round-robin (100)")
    parser.add_argument("--rate", type=float, default=3000.0, help="jobs a second (3000)")
    parser.add_argument("--sample", type=int, default=1500, help="claims explained per step")
    parser.add_argument("--no-hold", action="store_true", help="hold no snapshot: the control")
    args = parser.parse_args(argv)
    for flag in ("jobs", "steps", "keys", "rate", "sample"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be greater than 0, got {getattr(args, flag)}")
    return args


def enqueue(conn: psycopg.Connection[Any], schema: str, c: Churn, n: int) -> None:
    """n fair jobs through the real enqueue, keys round-robin from the jobs moved so far."""
    jobs = [
        NewJob("noop", {}, JobOptions(queue=QUEUE, fairness_key=f"tenant-{(c.moved + i) % c.keys}"))
        for i in range(n)
    ]
    run(conn, enqueue_plan(jobs, schema, None))  # type: ignore[arg-type]


def claim(conn: psycopg.Connection[Any], schema: str, c: Churn, hint: Hint) -> int:
    """One claim of up to CLAIM_LIMIT jobs from the hint at the injected now, finished at once."""
    params = _fair(hint.after or FAIR_FLOOR, State(hint.worker_id)) | {"now": c.now}
    c.claiming = True
    try:
        rows = conn.execute(query("job_claim_fair", schema), params).fetchall()
    finally:
        c.claiming = False
    got = [(r[0], r[3], r[4], r[11]) for r in rows if r[0] is not None]
    hint.moved(max(((p, v) for _, p, _, v in got), default=None))
    finished = [
        {"id": i, "attempt": a, "worker_id": hint.worker_id, "status": "succeeded"}
        for i, _, a, _ in got
    ]
    if finished:
        conn.execute(query("job_finish_many", schema), finish_rows_params(finished, keyed=False))
    c.claims += 1
    return len(got)


def prune(conn: psycopg.Connection[Any], schema: str, c: Churn) -> None:
    """The sweep's prunes (store/fairness.py prune_starts), every PRUNE_SECONDS of the clock."""
    if c.seconds - c.pruned_at < PRUNE_SECONDS:
        return
    c.pruned_at = c.seconds
    with contextlib.suppress(PgQueueError):  # a checkout from before the fold
        conn.execute(query("fairness_starts_fold", schema), {"now": c.now})
    conn.execute(query("fairness_starts_prune", schema), {"now": c.now})
    conn.execute(query("fairness_clock_prune", schema))
    conn.execute(query("fairness_key_prune", schema))


def churn(conn: psycopg.Connection[Any], schema: str, c: Churn, n: int) -> None:
    """Move n jobs through: a tick's enqueue, then claims in turn until it is all claimed."""
    target = c.moved + n
    while c.moved < target:
        size = min(TICK_JOBS, target - c.moved)
        enqueue(conn, schema, c, size)
        left = size
        while left > 0:
            got = claim(conn, schema, c, c.hints[c.claims % WORKERS])
            if not got:
                raise RuntimeError("the fair claim found nothing it had just enqueued")
            left -= got
            c.moved += got
        prune(conn, schema, c)


def by_node(plan: dict[str, Any], into: Counter[str]) -> None:
    """Each node's own shared buffers (bench/plans.py), summed by label into `into`."""
    for node, count in own_buffers(plan):
        into[_label(node)] += count
        into[TOTAL] += count


def _label(node: dict[str, Any]) -> str:
    kind = node.get("Node Type", "?")
    if kind == "ModifyTable":
        kind = node.get("Operation", kind)
    where = node.get("Index Name") or node.get("Relation Name") or node.get("Function Name") or ""
    cte = node.get("CTE Name") or str(node.get("Subplan Name", "")).removeprefix("CTE ")
    return " ".join(part for part in (kind, where, f"({cte})" if cte else "") if part)


def sample(conn: psycopg.Connection[Any], schema: str, c: Churn, claims: int) -> dict[str, float]:
    """The next `claims` claims' own buffers by node, a claim's average."""
    c.plans.clear()
    conn.execute("SET auto_explain.log_min_duration = 0")
    first = c.claims
    c.sampling = True
    try:
        while c.claims - first < claims:
            churn(conn, schema, c, TICK_JOBS)
    finally:
        c.sampling = False
        conn.execute("SET auto_explain.log_min_duration = -1")
    total: Counter[str] = Counter()
    for plan in c.plans:
        by_node(plan, total)
    return {label: n / max(len(c.plans), 1) for label, n in total.items()}


def explained(c: Churn) -> Any:
    """A notice handler keeping the fair claims' plans that auto_explain sends while sampling."""

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if c.sampling and c.claiming and "plan:" in text:
            doc = json.loads(text.split("plan:", 1)[1])
            c.plans.append(doc["Plan"])

    return keep


def claimer(dsn: str, schema: str, c: Churn) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True, application_name="bench:fair-rows")
    conn.execute(query("session_prefer_indexes", schema))
    conn.execute("LOAD 'auto_explain'")
    for name, value in (
        ("log_analyze", "on"),
        ("log_buffers", "on"),
        ("log_timing", "off"),
        ("log_format", "json"),
        ("log_min_duration", "-1"),
    ):
        conn.execute(sql.SQL("SET auto_explain.{} = {}").format(sql.SQL(name), sql.Literal(value)))
    conn.execute("SET client_min_messages = log")
    conn.add_notice_handler(explained(c))
    return conn


def fair_rows(
    dsn: str, jobs: int, steps: int, keys: int, rate: float, claims: int, hold: bool = True
) -> Any:
    schema = f"bench_fair_rows_{os.getpid()}"
    results: list[tuple[int, dict[str, float]]] = []
    with (
        psycopg.connect(dsn, autocommit=True, application_name="bench:fair-rows") as conn,
        psycopg.connect(dsn, application_name="bench:long-runner") as holder,
    ):
        try:
            first = setup(conn, schema).worker_id
            second = _register(conn, schema)
            row = conn.execute("SELECT now()").fetchone()
            c = Churn([Hint(first), Hint(second)], row[0] if row else datetime.now(), rate, keys)
            if hold:
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT txid_current()")
            with claimer(dsn, schema, c) as worker:
                for step in range(steps + 1):
                    began = time.monotonic()
                    churn(worker, schema, c, jobs * step // steps - c.moved)
                    print(
                        f"fair_rows: {c.moved:,} jobs, {c.seconds:.0f} s of the clock"
                        f" ({time.monotonic() - began:.1f} s to churn)",
                        file=sys.stderr,
                    )
                    results.append((c.moved, sample(worker, schema, c, claims)))
        finally:
            holder.rollback()
            drop_schema(dsn, schema)
    return results


def _register(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        query("worker_register", schema),
        {
            "name": "fair-rows",
            "hostname": "bench",
            "pid": os.getpid(),
            "queues": [QUEUE],
            "concurrency": CLAIM_LIMIT,
            "client_pid": None,
        },
    ).fetchone()
    return int(row[0]) if row else 0


def table(results: list[tuple[int, dict[str, float]]]) -> str:
    labels = sorted({label for _, r in results for label in r}, key=lambda x: (x != TOTAL, x))
    labels = [x for x in labels if any(r.get(x, 0) >= 0.05 for _, r in results)]
    lines = [
        "| node (own shared buffers a claim) | "
        + " | ".join(f"{n:,} jobs" for n, _ in results)
        + " |",
        "|---|" + "---:|" * len(results),
    ]
    for label in labels:
        cells = [f"{r.get(label, 0.0):.1f}" for _, r in results]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with database(options.dsn(args.dsn)) as server:
        results = fair_rows(
            server.dsn,
            args.jobs,
            args.steps,
            args.keys,
            args.rate,
            args.sample,
            hold=not args.no_hold,
        )
        held = "no snapshot held" if args.no_hold else "a snapshot held"
        print(
            f"PostgreSQL {server.version}, {held}, {args.keys} fairness keys,"
            f" {args.rate:,.0f} jobs/s on the claims' clock, {CLAIM_LIMIT}-job claims from"
            f" the hint, {WORKERS} workers,"
            f" {args.sample:,} claims a step"
        )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
