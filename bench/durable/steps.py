"""What a checkpoint costs, and ten steps in one job against a chain of ten jobs.

Owns: running bench/durable/app.py's tasks in a burst worker in this process, on a schema
the suite made, and turning what they recorded into figures.

- `checkpoints`: jobs of `per_job` rounds; each round runs the same work bare and as
  `ctx.step`, in turn, timed around the call inside the handler. The added latency of a
  step is each round's step time minus its bare time; p50 and p99 over every round. For a
  lease task a step adds its record, one statement committed on the worker's connection;
  for an atomic task it adds the cut of the job's transaction (the record, a commit, a new
  transaction that locks the job again), while the bare work waits for the job's one commit.
- `chains`: `jobs` durable jobs of ten steps against `jobs` chains of ten one-step jobs,
  the same work per step, each enqueued one per transaction, then drained by one burst
  worker at each concurrency; the rounds alternate which goes first. A lease job's step
  records commit one at a time on the worker's one connection for steps, shared by every
  job it runs, while its completer finishes jobs in batches: hence each concurrency.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.durable import app
from pgqueue import Queue, chain
from pgqueue.testing import drain

WORKS = ("noop", "insert")
# The task each kind of job runs, per part.
CHECKPOINT_TASKS = {"lease": app.checkpoints, "atomic": app.checkpoints_atomic}
CHAIN_WORKS = {
    "noop (lease)": (app.ten, app.link),
    "insert (atomic)": (app.ten_atomic, app.link_atomic),
}


def make_app_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (job bigint, n int)").format(
                sql.Identifier(app.APP_TABLE)
            )
        )


def _ms(values: list[float], q: float) -> float:
    """The q-quantile of `values` (seconds), in milliseconds."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 4)


def _drain_all(dsn: str, schema: str, concurrency: int) -> float:
    """Seconds for burst workers to leave no live job in `schema`; atomic jobs run at the
    same concurrency as the others."""
    started = time.perf_counter()
    for _ in range(20):
        drain(
            app.queue,
            dsn=dsn,
            schema=schema,
            concurrency=concurrency,
            atomic_concurrency=min(concurrency, 100),
        )
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
            ).fetchone()
        if row and row[0] == 0:
            return time.perf_counter() - started
    raise RuntimeError(f"jobs were left in {schema} after 20 drains")


def checkpoints(dsn: str, schema: str, steps: int, per_job: int) -> dict[str, Any]:
    """Each kind of task and work: bare and step times, and what a step adds."""
    app.state.dsn = dsn
    app.state.timings.clear()
    queue = Queue(dsn, schema=schema)
    counts = [per_job] * (steps // per_job) + ([steps % per_job] if steps % per_job else [])
    try:
        for task in CHECKPOINT_TASKS.values():
            for work in WORKS:
                queue.enqueue_many([task.job(count, work) for count in counts])
                _drain_all(dsn, schema, 1)
    finally:
        queue.close()
    found: dict[str, Any] = {}
    for kind, task in CHECKPOINT_TASKS.items():
        for work in WORKS:
            pairs = app.state.timings.get((task.name, work), [])
            if len(pairs) != steps:
                raise RuntimeError(f"{kind} {work}: {len(pairs)} rounds ran, not {steps}")
            bare = [b for b, _ in pairs]
            step = [s for _, s in pairs]
            added = [s - b for b, s in pairs]
            found[f"{kind} {work}"] = {
                "rounds": len(pairs),
                "bare_ms_p50": _ms(bare, 0.5),
                "bare_ms_p99": _ms(bare, 0.99),
                "step_ms_p50": _ms(step, 0.5),
                "step_ms_p99": _ms(step, 0.99),
                "added_ms_p50": _ms(added, 0.5),
                "added_ms_p99": _ms(added, 0.99),
                "ratio_p50": round(statistics.median(step) / statistics.median(bare), 2),
            }
    return found


def chains(
    dsn: str, schema: str, jobs: int, rounds: int, concurrencies: tuple[int, ...]
) -> dict[str, Any]:
    """Durable jobs of ten steps against chains of ten jobs, for each kind of work and each
    of the worker's concurrencies: enqueue and drain, jobs per second."""
    queue = Queue(dsn, schema=schema)
    found: dict[str, Any] = {}
    try:
        for work, (durable, one) in CHAIN_WORKS.items():
            for concurrency in concurrencies:
                runs: dict[str, list[dict[str, float]]] = {"durable": [], "chain": []}
                for r in range(rounds):
                    order = ("durable", "chain") if r % 2 == 0 else ("chain", "durable")
                    for shape in order:
                        started = time.perf_counter()
                        for n in range(jobs):
                            if shape == "durable":
                                queue.enqueue_many([durable.job()])
                            else:
                                links = (one.job(n * app.STEPS + i) for i in range(app.STEPS))
                                queue.enqueue_workflow(chain(*links))
                        enqueued = time.perf_counter() - started
                        ran = _drain_all(dsn, schema, concurrency)
                        runs[shape].append(
                            {
                                "enqueue_s": round(enqueued, 3),
                                "drain_s": round(ran, 3),
                                "per_s": round(jobs / ran, 1),
                                "end_to_end_per_s": round(jobs / (enqueued + ran), 1),
                            }
                        )
                found[f"{work}, concurrency {concurrency}"] = _compare(runs)
    finally:
        queue.close()
    return found


def _compare(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Medians per shape, and the durable job's rate over the chain's."""
    out: dict[str, Any] = {"runs": runs}
    for shape, rows in runs.items():
        out[shape] = {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}
    for key in ("per_s", "end_to_end_per_s"):
        out[f"ratio_{key}"] = round(out["durable"][key] / out["chain"][key], 2)
    return out
