"""How soon `wait()` returns once its job has finished: many waits in one process.

Each measure starts `waiters` AsyncQueue.wait calls in this process, all sharing the queue's
one listening connection, and lets their jobs finish only once every wait is registered (its
row in result_waiters). The waits note the wall clock when they return; all processes run on
this host, so their wall clocks agree.

- `commit`: the jobs are inserted as running (as a claim leaves them) and a finisher process
  finishes them one at a time, `gap` seconds apart, each with pgqueue's own job_finish_many
  statement (as a worker's completer runs it) in a transaction of its own. It notes the wall
  clock before sending each statement and just after its commit returned. Latency: a wait's
  return minus that commit: the notice, the shared connection's read of the job's record
  and the event loop's hand-over to the waiting coroutine.
- `worker`: a worker process (`pgqueue worker bench.durable.app:queue`) runs the jobs; each
  handler returns the wall clock just before it returns. Latency: a wait's return minus
  that: the worker's completer (which batches finishes), the finish's statement and commit
  included.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import AsyncQueue, Queue
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params

ROOT = Path(__file__).resolve().parents[2]
WORKER_ID = 1  # the finisher's jobs are "running" for this worker id; no worker runs there
WAIT_TIMEOUT = 120.0
REGISTER_TIMEOUT = 60.0


def finish_one_by_one(dsn: str, schema: str, ids: list[int], gap: float, path: str) -> None:
    """The finisher process: each job finished in a transaction of its own, `gap` apart;
    writes {id: [sent, committed]} to `path`."""
    statement = query("job_finish_many", schema)
    stamps: dict[int, tuple[float, float]] = {}
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        start = time.monotonic()
        for n, job_id in enumerate(ids):
            time.sleep(max(0.0, start + n * gap - time.monotonic()))
            outcome = {"id": job_id, "attempt": 1, "worker_id": WORKER_ID, "status": "succeeded"}
            sent = time.time()
            conn.execute(
                statement,
                finish_rows_params([outcome]),
            )
            stamps[job_id] = (sent, time.time())
    Path(path).write_text(json.dumps(stamps))


async def _wait_all(
    dsn: str, schema: str, ids: list[int], release: Callable[[], None]
) -> dict[int, tuple[float, Any]]:
    """Every wait started and registered, then `release()`; each wait's return time and
    result."""
    queue = AsyncQueue(dsn, schema=schema)
    returned: dict[int, tuple[float, Any]] = {}

    async def one(job_id: int) -> None:
        result = await queue.wait(job_id, timeout=WAIT_TIMEOUT)
        returned[job_id] = (time.time(), result)

    try:
        waits = [asyncio.create_task(one(job_id)) for job_id in ids]
        await _registered(dsn, schema, len(ids))
        release()
        await asyncio.gather(*waits)
    finally:
        await queue.close()
    return returned


async def _registered(dsn: str, schema: str, count: int) -> None:
    """Returns once `count` jobs are registered in result_waiters."""
    statement = sql.SQL("SELECT count(*) FROM {}.result_waiters").format(sql.Identifier(schema))
    deadline = time.monotonic() + REGISTER_TIMEOUT
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(statement)).fetchone()
            if row and row[0] >= count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{row[0] if row else 0} of {count} waits registered")
            await asyncio.sleep(0.02)


def _summary(latencies: list[float]) -> dict[str, Any]:
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)

    return {
        "jobs": len(ordered),
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "max_ms": round(ordered[-1] * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def by_commit(dsn: str, schema: str, waiters: int, gap: float) -> dict[str, Any]:
    """The `commit` measure."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, status, attempt, worker_id, started_at) "
                "SELECT 'default', 'bench.durable.stamp', '{{}}', 'running', 1, %s, now() "
                "FROM generate_series(1, %s) RETURNING id"
            ).format(sql.Identifier(schema)),
            [WORKER_ID, waiters],
        ).fetchall()
    ids = [int(r[0]) for r in rows]
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="pgqueue-bench-durable-") as tmp:
        path = str(Path(tmp) / "stamps.json")
        finisher = ctx.Process(
            target=finish_one_by_one, args=(dsn, schema, ids, gap, path), name="finisher"
        )
        try:
            returned = asyncio.run(_wait_all(dsn, schema, ids, finisher.start))
            finisher.join(WAIT_TIMEOUT)
        finally:
            if finisher.is_alive():
                finisher.terminate()
                finisher.join()
        if finisher.exitcode != 0:
            raise RuntimeError(f"the finisher exited with code {finisher.exitcode}")
        stamps = {int(k): v for k, v in json.loads(Path(path).read_text()).items()}
    return {
        "gap_s": gap,
        "from_commit": _summary([returned[i][0] - stamps[i][1] for i in ids]),
        "from_statement_sent": _summary([returned[i][0] - stamps[i][0] for i in ids]),
    }


def by_worker(dsn: str, schema: str, waiters: int, concurrency: int) -> dict[str, Any]:
    """The `worker` measure."""
    from bench.durable.app import stamp

    queue = Queue(dsn, schema=schema)
    try:
        ids = [int(e) for e in queue.enqueue_many([stamp.job() for _ in range(waiters)])]
    finally:
        queue.close()
    worker: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        worker.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "pgqueue", "worker", "bench.durable.app:queue",
                    "--dsn", dsn, "--schema", schema, "--concurrency", str(concurrency),
                    "--log-level", "warning",
                ],
                cwd=ROOT,
            )
        )  # fmt: skip

    try:
        returned = asyncio.run(_wait_all(dsn, schema, ids, start))
    finally:
        for proc in worker:
            proc.terminate()
            proc.wait(timeout=60)
    return {
        "concurrency": concurrency,
        "from_handler_return": _summary([at - float(result) for at, result in returned.values()]),
    }
