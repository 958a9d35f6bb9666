"""Workflows: what waiting jobs cost the claim, and how fast a big chord's callback starts.

    python -m bench workflows [--dsn DSN] [--jobs 20000] [--waiting 100000] [--members 10000]
                              [--rounds 3] [--workers 2] [--concurrency 50] [--out DIR] [--short]

- `claim`: two schemas, each with --jobs queued no-op jobs; one also holds --waiting blocked
  workflow jobs (chains of ten whose first step is scheduled a day ahead). One connection
  claims batches of 10 from each in turn (job_claim_unkeyed, as a worker does for a queue
  without keys) and finishes what it claimed (job_finish_many), until both are drained. The
  claim's time per statement is compared: a waiting job is not in the claim index, so it
  should cost the claim nothing.
- `finish`: the same, with every queued job the first step of a two-step chain, against
  plain jobs: what settling a dependant costs the statement that finishes a job.
- `fan-in`: --rounds times, a chord of --members members and a callback is enqueued in one
  call, --workers worker processes (`pgqueue worker bench.workflows.app:queue`) run it, and
  the callback's start is compared with its last member's finish, both server times from
  history.

Writes results.json to its results folder (bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.degradation.run import add_waiting
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from bench.workflows.app import collect, member
from pgqueue import Queue, chord, group
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params

BATCH = 10
ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "workflows",
        __doc__.split("\n\n")[0],
        short="the CI run: 2,000 jobs, 5,000 waiting, a 500-member chord, one round",
    )
    parser.add_argument("--jobs", type=int, help="queued jobs per claim schema (default 20000)")
    parser.add_argument("--waiting", type=int, help="blocked jobs beside them (default 100000)")
    parser.add_argument("--members", type=int, help="members of the chord (default 10000)")
    parser.add_argument("--rounds", type=int, help="chords run one after another (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--concurrency", type=int, default=50, help="each worker's concurrency (default 50)"
    )
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"jobs": 2000, "waiting": 5000, "members": 500, "rounds": 1},
        full={"jobs": 20000, "waiting": 100000, "members": 10000, "rounds": 3},
    )
    options.positive(
        parser,
        {
            "--jobs": args.jobs,
            "--members": args.members,
            "--rounds": args.rounds,
            "--workers": args.workers,
            "--concurrency": args.concurrency,
        },
    )
    if args.waiting < 0:
        parser.error(f"--waiting must be 0 or more, got {args.waiting}")
    return args


# -- claim and finish ----------------------------------------------------------------------------


def fill(dsn: str, schema: str, jobs: int, chained: bool) -> None:
    """`jobs` queued no-op jobs; with `chained`, each the first step of a two-step chain."""
    table = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not chained:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args) "
                    "SELECT 'default', 'noop', '{{}}' FROM generate_series(1, %s)"
                ).format(table),
                [jobs],
            )
        else:
            conn.execute(
                sql.SQL(
                    """
                    WITH heads AS (
                        INSERT INTO {s}.jobs (id, queue, task, args, workflow_id)
                        SELECT g, 'default', 'noop', '{{}}', g FROM generate_series(1, %(n)s) AS g
                        RETURNING id
                    ), tails AS (
                        INSERT INTO {s}.jobs (id, queue, task, args, status, workflow_id)
                        SELECT id + %(n)s, 'other', 'noop', '{{}}', 'blocked', id FROM heads
                    ), edges AS (
                        INSERT INTO {s}.job_deps (depends_on, job_id, position)
                        SELECT id, id + %(n)s, 0 FROM heads
                    )
                    INSERT INTO {s}.job_waits (job_id, remaining) SELECT id + %(n)s, 1 FROM heads
                    """
                ).format(s=table),
                {"n": jobs},
            )
            conn.execute(
                sql.SQL("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)"),
                [f"{schema}.jobs", 2 * jobs + 1],
            )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(table))


class Drain:
    """Claims one batch per step() on its own schema and connection, and finishes it, so
    that the scenarios can take turns and share the machine's noise alike."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.claim = query("job_claim_unkeyed", schema)
        self.finish = query("job_finish_many", schema)
        self.params: dict[str, Any] = {
            "queue": "default",
            "limit": BATCH,
            "worker_id": 1,
            "now": None,
            "after_priority": -32768,
            "after_id": 0,
            "before_priority": 32767,
            "before_id": 2**63 - 1,
            "limited_tasks": [],
        }
        self.conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=5)
        self.claim_times: list[float] = []
        self.finish_times: list[float] = []
        self.claimed = 0

    def step(self) -> bool:
        started = time.perf_counter()
        found = self.conn.execute(self.claim, self.params, prepare=True).fetchall()
        elapsed = time.perf_counter() - started
        rows = [r for r in found if r[0] is not None and not r[8]]  # jobs, not notes
        if not rows:
            self.conn.close()
            return False
        self.claim_times.append(elapsed)
        self.params["after_priority"], self.params["after_id"] = max((r[3], r[0]) for r in rows)
        self.claimed += len(rows)
        outcomes = [
            {"id": r[0], "attempt": r[4], "worker_id": 1, "status": "succeeded", "result": r[0]}
            for r in rows
        ]
        params = finish_rows_params(outcomes)
        started = time.perf_counter()
        self.conn.execute(self.finish, params, prepare=True)
        self.finish_times.append((time.perf_counter() - started) / len(rows))
        return True

    def result(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "claims": len(self.claim_times),
            "claim_ms_p50": round(statistics.median(self.claim_times) * 1000, 4),
            "claim_ms_p95": round(statistics.quantiles(self.claim_times, n=20)[18] * 1000, 4),
            "finish_us_per_job_p50": round(statistics.median(self.finish_times) * 1e6, 2),
        }


def take_turns(dsn: str, setups: dict[str, tuple[bool, int]], jobs: int) -> dict[str, Any]:
    """Each scenario (chained, waiting) on its own schema, claim by claim in turn."""
    import random

    with contextlib.ExitStack() as stack:
        drains = {}
        for name, (chained, waiting) in setups.items():
            schema = stack.enter_context(scratch_schema(dsn, "bench_workflows"))
            fill(dsn, schema, jobs, chained)
            if waiting:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    add_waiting(conn, schema, waiting)
            drains[name] = Drain(dsn, schema)
        active = list(drains)
        while active:
            random.shuffle(active)
            active = [name for name in active if drains[name].step()]
        return {name: d.result() for name, d in drains.items()}


# -- fan-in --------------------------------------------------------------------------------------


@contextlib.contextmanager
def workers(dsn: str, schema: str, count: int, concurrency: int) -> Iterator[None]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgqueue",
                "worker",
                "bench.workflows.app:queue",
                "--dsn",
                dsn,
                "--schema",
                schema,
                "--concurrency",
                str(concurrency),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
        )
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=120)


def fan_in(dsn: str, members: int, worker_count: int, concurrency: int) -> dict[str, Any]:
    with scratch_schema(dsn, "bench_workflows") as schema:
        queue = Queue(dsn, schema=schema)
        started = time.perf_counter()
        flow = queue.enqueue_workflow(
            chord(group(member.job(i) for i in range(members)), collect.s())
        )
        enqueue_s = time.perf_counter() - started
        callback = flow.job_ids[-1]
        with workers(dsn, schema, worker_count, concurrency):
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                job = queue.get_job(callback)
                if job is not None and job.finished:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError("the chord's callback did not finish within 10 minutes")
        queue.close()
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT max(finished_at) FILTER (WHERE id <> %(cb)s),"
                    " min(started_at) FILTER (WHERE id <> %(cb)s),"
                    " max(started_at) FILTER (WHERE id = %(cb)s),"
                    " count(*) FILTER (WHERE status = 'succeeded'),"
                    " max(result::text) FILTER (WHERE id = %(cb)s)"
                    " FROM {}.job_history WHERE workflow_id = %(wf)s"
                ).format(sql.Identifier(schema)),
                {"cb": callback, "wf": flow.id},
            ).fetchone()
        assert row is not None
        last_member, first_start, callback_start, succeeded, result = row
        if succeeded != members + 1 or result != str(members):
            raise RuntimeError(f"the chord did not run whole: {succeeded} succeeded, {result}")
        return {
            "members": members,
            "enqueue_s": round(enqueue_s, 3),
            "members_run_s": round((last_member - first_start).total_seconds(), 3),
            "fan_in_ms": round((callback_start - last_member).total_seconds() * 1000, 1),
        }


# -- the suite -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("workflows", lambda: bench(Run("workflows", argv, args.out, args.short), args))


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        claim = take_turns(
            server.dsn, {"plain": (False, 0), "with_waiting": (False, args.waiting)}, args.jobs
        )
        finish = take_turns(server.dsn, {"plain": (False, 0), "chain_heads": (True, 0)}, args.jobs)
        rounds = [
            fan_in(server.dsn, args.members, args.workers, args.concurrency)
            for _ in range(args.rounds)
        ]
        figures = {
            "batch": BATCH,
            "jobs": args.jobs,
            "waiting_jobs": args.waiting,
            "claim": claim,
            "claim_ratio_with_waiting": round(
                claim["with_waiting"]["claim_ms_p50"] / claim["plain"]["claim_ms_p50"], 3
            ),
            "finish": finish,
            "finish_ratio_chain_heads": round(
                finish["chain_heads"]["finish_us_per_job_p50"]
                / finish["plain"]["finish_us_per_job_p50"],
                3,
            ),
            "fan_in": {
                "workers": args.workers,
                "concurrency": args.concurrency,
                "rounds": rounds,
                "fan_in_ms_median": statistics.median(r["fan_in_ms"] for r in rounds),
                "fan_in_ms_max": max(r["fan_in_ms"] for r in rounds),
            },
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}")
    print(
        f"claim of {BATCH}, p50 ms: plain {claim['plain']['claim_ms_p50']:.3f}, "
        f"with {args.waiting:,} waiting {claim['with_waiting']['claim_ms_p50']:.3f} "
        f"(x{figures['claim_ratio_with_waiting']:.2f})"
    )
    print(
        f"finish per job, p50 us: plain {finish['plain']['finish_us_per_job_p50']:.1f}, "
        f"chain heads {finish['chain_heads']['finish_us_per_job_p50']:.1f} "
        f"(x{figures['finish_ratio_chain_heads']:.2f})"
    )
    for r in rounds:
        print(
            f"chord of {r['members']:,}: enqueued in {r['enqueue_s']:.2f} s, members ran in "
            f"{r['members_run_s']:.1f} s, callback started {r['fan_in_ms']:.0f} ms after "
            "the last member finished"
        )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
