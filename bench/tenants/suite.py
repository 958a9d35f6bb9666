"""Per-key concurrency limits: what they cost the claim, and how fair they are.

    python -m bench tenants [--dsn DSN] [--jobs N] [--rounds N] [--backlog N] [--out DIR]
                            [--short]

Cost: each scenario has its own fresh schema with --jobs jobs, claimed in batches of 100 by
its own connection that prepares statements like a worker; 500 claimed jobs are kept
running (so the naive baseline has running jobs to count) and the oldest are finished
through job_finish_many, whose trigger gives keyed slots back. Each claim statement is timed
alone. The scenarios take turns claim by claim, in a shuffled order, so a noisy neighbour on
the machine hits them all alike; --rounds repeats this (the median is reported):

  main         the job_claim from before concurrency keys existed, jobs without keys
  none         today's job_claim_unkeyed, jobs without keys: what a worker runs until
               it meets a keyed job in the queue
  none-keyed-stmt  today's job_claim (the keyed statement), jobs without keys
  keys-K       today's job_claim, every job keyed, K keys round-robin (1, 100, 10000);
               the default limit (1000) is never reached, so this is admission, not parking
  naive-K      the textbook per-key claim: every claim counts the running jobs
               GROUP BY key, leaves out the keys at their limit with NOT IN, and takes the
               first queued jobs from the front of the queue (no hint); same jobs as keys-K
  naive-hinted-K  the same count and NOT IN, but starting after the hint like job_claim: not
               the textbook one, it separates what the per-claim count costs from what starting at
               the front costs
  saturated-keys / saturated-naive / saturated-naive-hinted
               half the jobs belong to key "big", at its limit (5) and queued ahead of the
               rest; the other half over 100 keys: job_claim parks big's backlog once; the
               naive claim walks and filters it out on every claim (the hinted naive one
               only once, as its hint moves past it)

Before its claims, each scenario EXPLAINs its claim statement as a generic plan (what a
prepared statement settles on) and records which indexes it scans; afterwards it records
how many generic and custom plans its prepared claim actually ran (pg_prepared_statements).
The finish of the held jobs is timed too (keyed jobs run the release trigger), apart.

Fairness: --backlog jobs of key "big" (limit 5) are queued, then one job of key "small";
then a Worker (concurrency 20, handlers sleep 10 ms) starts. Reported: how long the small
job waited after the worker started and how many claim statements ran before it, against a
control run with the small job alone; and, once the backlog is parked, the latency of a
second small job enqueued while the worker runs.

Writes tenants.json and tenants.png to its results folder (bench/report.py) and prints the
summary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.plans import custom_plan, generic_plan, succeeded
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue, Worker
from pgqueue.queries import query

BATCH = 100
HELD = 500  # claimed jobs kept running while the next claims run
DEFAULT_LIMIT = 1000
KEY_COUNTS = (1, 100, 10_000)
SATURATED = -1  # "keys" of the saturated scenarios: see saturate()
FLOOR = {"after_priority": -32768, "after_id": 0}
CEILING = {"before_priority": 32767, "before_id": 2**63 - 1}

# job_claim as on main (8281606), before concurrency keys: the "main" scenario.
MAIN_CLAIM = """
WITH picked AS (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'queued' AND NOT atomic
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)
    ORDER BY priority, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = 'running', attempt = j.attempt + 1,
    started_at = coalesce(%(now)s::timestamptz, now()), worker_id = %(worker_id)s
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
"""

# The textbook tenant claim, in this schema: a table of per-tenant limits, and every claim
# counts the running jobs of every key and leaves out the full keys with NOT IN. {start} is
# empty (from the front of the queue, ORDER BY id; here (priority, id), on jobs_claim_idx,
# which all-zero priorities make the same order) or the hint of job_claim (naive-hinted).
# Batches of 100 instead of the textbook's LIMIT 1. It can
# over-admit: a batch may take several jobs of a key with one slot left, and two claims can
# both see room; no scenario here reaches a limit it could overshoot.
NAIVE_CLAIM = """
WITH running_jobs_per_key AS (
    SELECT concurrency_key AS key, count(1) AS running_jobs FROM {schema}.jobs
    WHERE status = 'running' AND concurrency_key IS NOT NULL
      AND created_at > now() - interval '6 hours'
    GROUP BY 1
), full_keys AS (
    SELECT r.key FROM running_jobs_per_key AS r
    LEFT JOIN {schema}.concurrency_limits AS q ON q.key = r.key
    LEFT JOIN {schema}.concurrency_limits AS d ON d.key = '*'
    WHERE r.running_jobs >= coalesce(q.max_running, d.max_running)
), picked AS (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s AND status = 'queued' AND NOT atomic {start}
      AND (concurrency_key IS NULL OR concurrency_key NOT IN (SELECT key FROM full_keys))
    ORDER BY priority, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = 'running', attempt = j.attempt + 1,
    started_at = coalesce(%(now)s::timestamptz, now()), worker_id = %(worker_id)s
FROM picked WHERE j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
          false
"""
HINTED = """
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)"""


def scenarios() -> list[tuple[str, str, int]]:
    """(name, statement: main|unkeyed|branch|naive|naive-hinted, keys)."""
    found = [("main", "main", 0), ("none", "unkeyed", 0), ("none-keyed-stmt", "branch", 0)]
    for kind, prefix in (("branch", "keys"), ("naive", "naive"), ("naive-hinted", "naive-hinted")):
        found += [(f"{prefix}-{k}", kind, k) for k in KEY_COUNTS]
    found += [
        ("saturated-keys", "branch", SATURATED),
        ("saturated-naive", "naive", SATURATED),
        ("saturated-naive-hinted", "naive-hinted", SATURATED),
    ]
    return found


def fresh_schema(dsn: str) -> contextlib.AbstractContextManager[str]:
    """A migrated schema of the bench's own, dropped at the end."""
    return scratch_schema(dsn, "bench_tenants")


def fill(dsn: str, schema: str, jobs: int, keys: int) -> None:
    """Insert the jobs straight in SQL (the bench measures claims, not enqueue)."""
    key = "NULL" if keys == 0 else f"'k' || (g %% {keys})"
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = sql.Identifier(schema)
        if keys == SATURATED:
            saturate(conn, schema, jobs // 2)
            jobs, key = jobs - jobs // 2, "'k' || (g %% 100)"
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, concurrency_key) "
                "SELECT 'default', 'noop', '{{}}', " + key + " FROM generate_series(1, %s) AS g"
            ).format(table),
            [jobs],
        )
        conn.execute(
            sql.SQL("INSERT INTO {}.concurrency_limits VALUES ('*', %s)").format(table),
            [DEFAULT_LIMIT],
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(table))


def saturate(conn: psycopg.Connection[Any], schema: str, backlog: int) -> None:
    """Key "big" at its limit of 5 (5 jobs running for good), with `backlog` queued jobs
    ahead of everything else in the queue: the naive claim filters them out on every claim,
    job_claim parks them once."""
    table = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, concurrency_key, status, attempt, "
            "worker_id) SELECT 'default', 'noop', '{{}}', 'big', "
            "CASE WHEN g <= 5 THEN 'running' ELSE 'queued' END, "
            "CASE WHEN g <= 5 THEN 1 ELSE 0 END, CASE WHEN g <= 5 THEN 999 END "
            "FROM generate_series(1, %s) AS g"
        ).format(table),
        [backlog + 5],
    )
    conn.execute(sql.SQL("INSERT INTO {}.concurrency_limits VALUES ('big', 5)").format(table))
    conn.execute(sql.SQL("INSERT INTO {}.concurrency_slots VALUES ('big', 5, 0, 5)").format(table))


def claim_statement(kind: str, schema: str) -> Any:
    if kind in ("branch", "unkeyed"):
        return query("job_claim" if kind == "branch" else "job_claim_unkeyed", schema)
    if kind == "main":
        return sql.SQL(MAIN_CLAIM).format(schema=sql.Identifier(schema))
    start = sql.SQL(HINTED if kind == "naive-hinted" else "")
    return sql.SQL(NAIVE_CLAIM).format(schema=sql.Identifier(schema), start=start)


def plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """What the plan reads from jobs. `index_scan`: no read of jobs is a sequential scan, and
    the claim's own read is an Index Scan on jobs_claim_idx."""

    def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    scans = [
        {"node": n["Node Type"], "index": n.get("Index Name"), "cond": n.get("Index Cond")}
        for n in nodes(plan)
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    ]
    claim = [s for s in scans if s["index"] == "jobs_claim_idx"]
    through_index = all(s["node"] != "Seq Scan" for s in scans)  # bitmap scans use an index
    return {
        "index_scan": through_index and bool(claim) and claim[0]["node"] == "Index Scan",
        "jobs_scans": scans,
    }


class CostRun:
    """One scenario's claims on its own schema and connection, one claim per step(), so the
    scenarios can take turns and share the machine's noise alike."""

    def __init__(self, dsn: str, schema: str, kind: str, keys: int, jobs: int) -> None:
        fill(dsn, schema, jobs, keys)
        self.kind = kind
        self.statement = claim_statement(kind, schema)
        self.finish = query("job_finish_many", schema)
        self.params: dict[str, Any] = {"queue": "default", "limit": BATCH, "worker_id": 1}
        self.params |= {"now": None, "limited_tasks": []} | FLOOR | CEILING
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=5)
        self.plan = {
            "generic": plan_summary(generic_plan(self.conn, self.statement, self.params)),
            "custom": plan_summary(custom_plan(self.conn, self.statement, self.params)),
        }
        self.plans_run: dict[str, int] = {}
        self.times: list[float] = []
        self.finish_times: list[float] = []
        self.claimed = 0
        self.held: deque[int] = deque()

    def step(self) -> bool:
        """One claim (and the finish of the oldest held jobs); False once nothing is left."""
        started = time.perf_counter()
        found = self.conn.execute(self.statement, self.params, prepare=True).fetchall()
        elapsed = time.perf_counter() - started
        rows = [r for r in found if r[0] is not None]  # jobs, not the unkeyed claim's last row
        if not rows:
            self.plans_run = self._plans_run()
            self.conn.close()
            return False
        self.times.append(elapsed)
        ran = [r[0] for r in rows if self.kind == "main" or not r[8]]
        self.params["after_priority"], self.params["after_id"] = max((r[3], r[0]) for r in rows)
        self.claimed += len(ran)
        self.held.extend(ran)
        if len(self.held) > HELD:
            done = [self.held.popleft() for _ in range(len(self.held) - HELD)]
            outcomes = succeeded(done)
            started = time.perf_counter()
            self.conn.execute(self.finish, outcomes)
            self.finish_times.append((time.perf_counter() - started) / len(done))
        return True

    def _plans_run(self) -> dict[str, int]:
        """How often the server ran the prepared claim with a generic or a custom plan. psycopg
        prepares it once per set of parameter types (the hint's id outgrows int2, then int4),
        so this sums its statements."""
        row = self.conn.execute(
            "SELECT sum(generic_plans)::int, sum(custom_plans)::int FROM pg_prepared_statements "
            "WHERE statement LIKE '%%SKIP LOCKED%%' AND NOT from_sql"
        ).fetchone()
        return {"generic": row[0], "custom": row[1]} if row and row[0] is not None else {}

    def result(self) -> dict[str, Any]:
        return {
            "times": self.times,
            "claimed": self.claimed,
            "finish_times": self.finish_times,
            "plan": self.plan,
            "plans_run": self.plans_run,
        }


def measure_costs(dsn: str, jobs: int) -> dict[str, dict[str, Any]]:
    """Every scenario at once, taking turns claim by claim in a shuffled order."""
    import random

    with contextlib.ExitStack() as stack:
        runs = {
            name: CostRun(dsn, stack.enter_context(fresh_schema(dsn)), kind, keys, jobs)
            for name, kind, keys in scenarios()
        }
        active = list(runs)
        while active:
            random.shuffle(active)
            active = [name for name in active if runs[name].step()]
        return {name: run.result() for name, run in runs.items()}


def summarize_cost(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["claimed"] / sum(r["times"]) for r in runs]
    p50 = [statistics.median(r["times"]) * 1000 for r in runs]
    p95 = [statistics.quantiles(r["times"], n=20)[18] * 1000 for r in runs]
    finish = [statistics.median(r["finish_times"]) * 1e6 for r in runs if r["finish_times"]]
    return {
        "claimed_per_run": runs[0]["claimed"],
        "claims_per_run": len(runs[0]["times"]),
        "jobs_per_second": statistics.median(rates),
        "jobs_per_second_runs": rates,
        "claim_ms_p50": statistics.median(p50),
        "claim_ms_p95": statistics.median(p95),
        "finish_us_per_job_p50": statistics.median(finish) if finish else None,
        # Whichever plan the server picks for the prepared claim (pg_prepared_statements
        # says which it ran), it reads jobs through indexes.
        "index_scan": all(p["index_scan"] for r in runs for p in r["plan"].values()),
        "plan": runs[0]["plan"],
        "plans_run": [r["plans_run"] for r in runs],
    }


# -- fairness --------------------------------------------------------------------------------


def measure_fairness(dsn: str, backlog: int) -> dict[str, Any]:
    with fresh_schema(dsn) as schema:
        queue = Queue(dsn, schema=schema)
        started: dict[str, float] = {}
        claims: dict[str, int] = {}
        seen = threading.Event()
        holder: list[Worker] = []

        @queue.task(name="work")
        async def work(label: str) -> None:
            if label != "big":
                started[label] = time.perf_counter()
                claims[label] = holder[0].stats.claims
                seen.set()
            await asyncio.sleep(0.01)

        queue.set_concurrency_limit("big", 5)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args, concurrency_key) "
                    "SELECT 'default', 'work', '{{\"label\": \"big\"}}', 'big' "
                    "FROM generate_series(1, %s)"
                ).format(sql.Identifier(schema)),
                [backlog],
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))
        queue.enqueue(work.job("small-1"), concurrency_key="small")
        worker = Worker(queue, dsn=dsn, schema=schema, concurrency=20)
        holder.append(worker)
        with running(worker) as t0:
            _wait(seen, "the first small job")
            first = started["small-1"] - t0
            claims_first = claims["small-1"]
            seen.clear()
            _wait_parked(dsn, schema, backlog)
            before = worker.stats.claims
            t1 = time.perf_counter()
            queue.enqueue(work.job("small-2"), concurrency_key="small")
            _wait(seen, "the second small job")
            second = started["small-2"] - t1
            claims_second = claims["small-2"] - before
            slowest = max(s for s, _ in worker.stats.recent_claims)
        queue.close()
    return {
        "backlog": backlog,
        "first_small_wait_s": first,
        "claims_before_first_small": claims_first,
        "slowest_claim_s": slowest,
        "second_small_wait_s": second,
        "claims_for_second_small": claims_second,
    }


def measure_control(dsn: str) -> dict[str, Any]:
    with fresh_schema(dsn) as schema:
        queue = Queue(dsn, schema=schema)
        started: dict[str, float] = {}
        seen = threading.Event()

        @queue.task(name="work")
        async def work(label: str) -> None:
            started[label] = time.perf_counter()
            seen.set()

        queue.enqueue(work.job("small-1"), concurrency_key="small")
        worker = Worker(queue, dsn=dsn, schema=schema, concurrency=20)
        with running(worker) as t0:
            _wait(seen, "the small job")
        queue.close()
        return {"small_wait_s": started["small-1"] - t0}


@contextmanager
def running(worker: Worker) -> Iterator[float]:
    """Run `worker` in a thread; yields the perf_counter time it was started."""
    thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
    t0 = time.perf_counter()
    thread.start()
    try:
        yield t0
    finally:
        worker.stop(force=True)
        thread.join(timeout=120)


def _wait(event: threading.Event, what: str) -> None:
    if not event.wait(timeout=600):
        raise SystemExit(f"bench: timed out waiting for {what}")


def _wait_parked(dsn: str, schema: str, backlog: int) -> None:
    """Until no job of the backlog is queued: all are waiting, running or done."""
    deadline = time.monotonic() + 600
    with psycopg.connect(dsn, autocommit=True) as conn:
        stmt = sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'queued'").format(
            sql.Identifier(schema)
        )
        while conn.execute(stmt).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise SystemExit("bench: the backlog was never parked")
            time.sleep(0.05)


# -- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = options.parser(
        "tenants", __doc__.splitlines()[0], short="CI-sized: 3000 jobs, 1 round"
    )
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs per scenario")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every scenario")
    parser.add_argument("--backlog", type=int, default=100_000, help="jobs of the big key")
    args = parser.parse_args(argv)
    if args.short:
        args.jobs, args.rounds, args.backlog = 3000, 1, 3000
    options.positive(
        parser, {"--jobs": args.jobs, "--rounds": args.rounds, "--backlog": args.backlog}
    )
    return guarded("tenants", lambda: bench(Run("tenants", argv, args.out, args.short), args))


def bench(run_: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run_.folder(server)
        result = run(server.dsn, args) | {"postgres": server.version}
        run_.write(out, "tenants.json", server, result)
    chart(result, out / "tenants.png")
    print_summary(result)
    print(f"wrote {out}/tenants.json and tenants.png", file=sys.stderr)
    return 0


def run(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    raw: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in scenarios()}
    for round_ in range(args.rounds):
        for name, measured in measure_costs(dsn, args.jobs).items():
            raw[name].append(measured)
        print(f"round {round_ + 1} done", file=sys.stderr)
    cost = {name: summarize_cost(runs) for name, runs in raw.items()}
    return {
        "jobs": args.jobs,
        "rounds": args.rounds,
        "batch": BATCH,
        "held_running": HELD,
        "cost": cost,
        "fairness": measure_fairness(dsn, args.backlog),
        "fairness_control": measure_control(dsn),
    }


def print_summary(result: dict[str, Any]) -> None:
    base = result["cost"]["main"]["jobs_per_second"]
    print(f"PostgreSQL {result['postgres']}, {result['jobs']} jobs, batch {result['batch']}")
    print(
        f"{'scenario':<23} {'jobs/s':>9} {'vs main':>8} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'finish us/job':>14}  plan (generic): reads of jobs"
    )
    for name, c in result["cost"].items():
        finish = c["finish_us_per_job_p50"]
        scans = ", ".join(
            f"{s['node']} {s['index'] or ''}".strip() for s in c["plan"]["generic"]["jobs_scans"]
        )
        ran = c["plans_run"][0]
        print(
            f"{name:<23} {c['jobs_per_second']:>9.0f} {c['jobs_per_second'] / base:>8.2f} "
            f"{c['claim_ms_p50']:>8.2f} {c['claim_ms_p95']:>8.2f} "
            f"{finish if finish is not None else float('nan'):>14.1f}  "
            f"{'index' if c['index_scan'] else 'NOT INDEX'} (ran {ran.get('generic', 0)} "
            f"generic, {ran.get('custom', 0)} custom); generic: {scans}"
        )
    f, ctl = result["fairness"], result["fairness_control"]
    print(
        f"fairness: backlog {f['backlog']} of one key (limit 5): the other key's job started "
        f"after {f['first_small_wait_s']:.3f} s and {f['claims_before_first_small']} claims "
        f"(alone: {ctl['small_wait_s']:.3f} s); slowest claim {f['slowest_claim_s']:.3f} s; "
        f"once parked, a new job started after {f['second_small_wait_s']:.3f} s and "
        f"{f['claims_for_second_small']} claims"
    )


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["cost"])
    rates = [result["cost"][n]["jobs_per_second"] for n in names]
    p50 = [result["cost"][n]["claim_ms_p50"] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6))
    colors = ["#888888" if n == "main" else "#d62728" if "naive" in n else "#1f77b4" for n in names]
    left.bar(names, rates, color=colors)
    left.set_ylabel("jobs claimed per second of claim time")
    left.set_title(f"claim throughput, batch {result['batch']}")
    right.bar(names, p50, color=colors)
    right.set_ylabel("ms per claim (median)")
    right.set_title(f"PostgreSQL {result['postgres']}, {result['held_running']} held running")
    for ax in (left, right):
        ax.set_xticks(range(len(names)), names, rotation=50, ha="right", rotation_mode="anchor")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
