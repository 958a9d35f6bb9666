"""One run of the degradation bench: one strategy in one mode, on a fresh schema.

Owns: the run's schema (made by pgqueue.migrate.apply, dropped at the end whatever happened)
and its processes (bench/degradation/roles.py), which are all stopped and joined before the
schema is dropped: asked through one `stop` event, then terminated, then killed. A process
that exits early, or one not ready within READY_TIMEOUT_SECONDS, fails the run with
RuntimeError.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg
from psycopg import sql

from bench.degradation import roles
from bench.degradation.sampler import Prober, Sample, Sampler, counters_hint, history_hint
from bench.degradation.windows import WINDOW_SECONDS, Windows
from bench.durable.parked import add_parked
from pgqueue.migrate import apply
from pgqueue.queries import query

TICK_SECONDS = 0.01
READY_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 40.0  # pgqueue's workers finish their (no-op) jobs before exiting


def create_schema(conn: psycopg.Connection[Any], schema: str) -> bool:
    """A fresh schema migrated by pgqueue; True if its jobs table has the `atomic` column."""
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    apply(conn, schema)
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = 'jobs' AND column_name = 'atomic')",
        [schema],
    ).fetchone()
    return bool(row and row[0])


def add_waiting(conn: psycopg.Connection[Any], schema: str, jobs: int) -> None:
    """`jobs` workflow jobs that wait the whole run: chains of ten whose first step is
    scheduled a day ahead, the other nine blocked on the step before. Written in SQL, as the
    migration's tables hold them (the bench measures claims, not enqueue)."""
    chains = max(jobs // 10, 1)
    conn.execute(
        sql.SQL(
            """
            WITH steps AS (
                SELECT c, s, (c * 10 + s) AS id FROM generate_series(1, %(chains)s) AS c,
                     generate_series(0, 9) AS s
            ), jobs AS (
                INSERT INTO {schema}.jobs (id, queue, task, args, status, run_at, workflow_id)
                SELECT -id, 'default', 'noop', '{{}}',
                       CASE WHEN s = 0 THEN 'scheduled' ELSE 'blocked' END,
                       now() + interval '1 day', -(c * 10)
                FROM steps
            ), edges AS (
                INSERT INTO {schema}.job_deps (depends_on, job_id, position)
                SELECT -(id - 1), -id, 0 FROM steps WHERE s > 0
            )
            INSERT INTO {schema}.job_waits (job_id, remaining)
            SELECT -id, 1 FROM steps WHERE s > 0
            """
        ).format(schema=sql.Identifier(schema)),
        {"chains": chains},
    )
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True, application_name="bench:cleanup") as conn:
        conn.execute("SET lock_timeout = '20s'")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def plan_indexes(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]
) -> list[str]:
    """The indexes the planner would use for `statement` now (EXPLAIN, nothing runs)."""
    row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, params).fetchone()
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "Index Name" in node:
                found.append(str(node["Index Name"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(row[0] if row else None)
    return sorted(set(found))


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Run:
    """The processes of one (strategy, mode) run, stopped together by `stop`."""

    ctx: ForkServerContext
    stop: Any
    processes: list[BaseProcess] = field(default_factory=list)

    def start(self, name: str, target: Any, *args: Any) -> None:
        """Start target(*args) as a daemon process (it dies with the bench at worst)."""
        process = self.ctx.Process(target=target, args=args, name=name, daemon=True)
        process.start()
        self.processes.append(process)

    def wait_ready(self, readies: Sequence[Any]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        for ready in readies:
            while not ready.wait(0.1):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench processes not ready after {READY_TIMEOUT_SECONDS}s")

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.is_alive():
                raise RuntimeError(f"{process.name} exited early with code {process.exitcode}")

    def close(self) -> None:
        """Stop every process: ask, wait, then terminate and kill what is left."""
        self.stop.set()
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                print(f"bench: {process.name} did not stop; terminating it", file=sys.stderr)
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join()


def run_one(
    ctx: ForkServerContext,
    dsn: str,
    strategy: str,
    mode: str,
    *,
    duration: float,
    rate: float,
    workers: int,
    hold: float | None,
    waiting: int = 0,
    sleeping: int = 0,
    fairness_keys: int = 0,
) -> tuple[list[Sample], list[dict[str, Any]], dict[str, Any]]:
    """Run one strategy in one mode on a fresh schema; returns its samples, its 10-s windows
    (bench/degradation/windows.py) and plan notes.

    `hold` is how long the long-runner (hold mode only) keeps its snapshot; None: throughout.
    `waiting` blocked workflow jobs sit in the jobs table throughout (pgqueue strategies),
    and `sleeping` jobs parked by durable sleeps and signal waits, in the claimed queue.
    `fairness_keys`: the producer's jobs carry fairness keys, round-robin over that many.
    """
    schema = f"bench_degradation_{strategy}_{mode}_{os.getpid()}"
    run = Run(ctx, ctx.Event())
    try:
        with psycopg.connect(dsn, autocommit=True, application_name="bench:sampler") as conn:
            not_atomic = create_schema(conn, schema)
            if waiting:
                add_waiting(conn, schema, waiting)
            if sleeping:
                add_parked(conn, schema, sleeping, roles.QUEUE)
            if mode == "hold":
                ready = ctx.Event()
                run.start("long-runner", roles.long_runner, dsn, hold, ready, run.stop)
                run.wait_ready([ready])
            counters = _start_workers(run, dsn, schema, strategy, workers, not_atomic)
            produced, go, ready = ctx.RawValue("q", 0), ctx.Event(), ctx.Event()
            args = (dsn, schema, rate, TICK_SECONDS, ready, go, run.stop, produced, fairness_keys)
            run.start("producer", roles.produce, *args)
            run.wait_ready([ready])
            hint = history_hint(schema) if strategy == "default" else counters_hint(counters)
            prober = Prober(dsn, schema, hint)
            prober.start()
            try:
                sampler = Sampler(conn, strategy, mode, schema, counters, produced, prober)
                go.set()
                sampler.start()
                windows = Windows(conn, schema, sampler.claims, statements_loaded(conn))
                samples, rows = _sample(run, sampler, windows, duration)
                rows = [{"strategy": strategy, "mode": mode} | row for row in rows]
                notes = _plans(conn, schema, strategy, not_atomic)
            finally:
                prober.halt()
    finally:
        run.close()
        drop_schema(dsn, schema)
    return samples, rows, notes


def statements_loaded(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server preloads pg_stat_statements; if so, the extension is created."""
    row = conn.execute("SHOW shared_preload_libraries").fetchone()
    if row is None or "pg_stat_statements" not in str(row[0]):
        return False
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def _start_workers(
    run: Run, dsn: str, schema: str, strategy: str, workers: int, not_atomic: bool
) -> list[Any]:
    """Start the worker processes and wait until each claims; returns their counters."""
    counters = [run.ctx.RawArray("q", roles.SLOTS) for _ in range(workers)]
    readies = []
    for n, slots in enumerate(counters, start=1):
        ready = run.ctx.Event()
        if strategy == "default":
            run.start(f"worker-{n}", roles.pgqueue_worker, dsn, schema, ready, run.stop, slots)
        else:
            args = (dsn, schema, strategy == "hint", not_atomic, n, ready, run.stop, slots)
            run.start(f"worker-{n}", roles.claim_loop, *args)
        readies.append(ready)
    run.wait_ready(readies)
    return counters


def _sample(
    run: Run, sampler: Sampler, windows: Windows, duration: float
) -> tuple[list[Sample], list[dict[str, Any]]]:
    """One sample at each whole second after the start; a late one skips to the next second.
    A window row every WINDOW_SECONDS of samples, and one for the samples left at the end."""
    samples: list[Sample] = []
    rows: list[dict[str, Any]] = []
    second, window_start = 1, 0
    while second <= duration + 1e-9:
        time.sleep(max(0.0, sampler.t0 + second - time.monotonic()))
        run.check_alive()
        samples.append(sampler.sample())
        if samples[-1].t_s - (samples[window_start].t_s - 1) >= WINDOW_SECONDS - 0.5:
            rows.append(windows.take(samples[-1].t_s, [s.depth for s in samples[window_start:]]))
            window_start = len(samples)
        second = max(second + 1, math.ceil(time.monotonic() - sampler.t0))
    if window_start < len(samples):
        rows.append(windows.take(samples[-1].t_s, [s.depth for s in samples[window_start:]]))
    return samples, rows


def _plans(
    conn: psycopg.Connection[Any], schema: str, strategy: str, not_atomic: bool
) -> dict[str, Any]:
    """Which indexes the claims use at the end of the run: plain/hint must walk job_claim's."""
    params = {
        "queue": roles.QUEUE,
        "after_priority": roles.FLOOR[0],
        "after_id": roles.FLOOR[1],
        "before_priority": roles.CEILING[0],
        "before_id": roles.CEILING[1],
        "limit": 10,
        "worker_id": -1,
        "worker": -1,
        "now": None,
    }
    library = plan_indexes(conn, query("job_claim", schema), params)
    notes: dict[str, Any] = {"job_claim_plan_indexes": library}
    if strategy != "default":
        claim, _ = roles.claim_statements(schema, strategy == "hint", not_atomic)
        own = plan_indexes(conn, claim, params)
        notes["claim_plan_indexes"] = own
        # job_claim also reads the tenants' tables and index for keyed jobs; the walk that
        # matters, over the queue, must be on the same index.
        if ("jobs_claim_idx" in own) != ("jobs_claim_idx" in library):
            print(
                f"bench: warning: the {strategy} claim uses {own}, job_claim uses {library}",
                file=sys.stderr,
            )
    return notes
