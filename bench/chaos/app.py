"""The application the chaos suite (bench/chaos/suite.py) runs: its tables, its two tasks,
its records.

Each run has its own schema holding pgqueue's tables and two of ours:

- `bench_orders`: one row per producer transaction; the job enqueued in that transaction
  carries the order's id, so an order exists exactly when its job was committed.
- `bench_runs`: one row per run of an atomic job, written through `ctx.connection`, so it
  commits exactly with the job's completion. No unique key: a second run must show as a
  second row, not as a failed insert.

Lease jobs record a run by appending `job_id attempt order_id` to `runs-<pid>.txt` in the
run folder (O_APPEND, one write per line), after their work and before their completion is
written: a worker killed in between leaves a recorded run whose job runs again. A killed
process loses at most the line it was writing.

Atomic handlers also note their connection's backend pid in `backends-<pid>.txt`, so the
fault injector can tell whether a worker is inside an atomic job before it kills it.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import JobContext, Queue, Task

MODES = ("lease", "atomic")
LEASE_TASK = "chaos.lease"
ATOMIC_TASK = "chaos.atomic"
RUN_DIR_ENV = "PGQUEUE_CHAOS_RUN_DIR"

_files: dict[str, int] = {}
_backends: set[int] = set()


def make_queue(mode: str, schema: str) -> tuple[Queue, Task[Any]]:
    """A Queue on `schema` with the one task of `mode` registered; returns it and the task."""
    queue = Queue(schema=schema)
    if mode == "lease":

        @queue.task(name=LEASE_TASK)
        async def lease(order_id: int, work_ms: float, ctx: JobContext) -> None:
            await asyncio.sleep(work_ms / 1000)
            _append("runs", f"{ctx.job_id} {ctx.attempt} {order_id}")

        return queue, lease
    if mode == "atomic":
        insert = sql.SQL(
            "INSERT INTO {}.bench_runs (job_id, attempt, order_id, pid) VALUES (%s, %s, %s, %s)"
        ).format(sql.Identifier(schema))

        @queue.task(name=ATOMIC_TASK, atomic=True)
        async def atomic(order_id: int, work_ms: float, ctx: JobContext) -> None:
            backend = ctx.connection.info.backend_pid
            if backend not in _backends:
                _backends.add(backend)
                _append("backends", str(backend))
            await ctx.connection.execute(insert, [ctx.job_id, ctx.attempt, order_id, os.getpid()])
            await asyncio.sleep(work_ms / 1000)  # a kill now rolls the row above back

        return queue, atomic
    raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def _append(kind: str, line: str) -> None:
    fd = _files.get(kind)
    if fd is None:
        folder = Path(os.environ[RUN_DIR_ENV])
        path = folder / f"{kind}-{os.getpid()}.txt"
        fd = _files[kind] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\n").encode())


def create_tables(conn: psycopg.Connection[Any], schema: str) -> None:
    """The application's tables, in the run's (already migrated) schema."""
    s = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.bench_orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
            " producer integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        ).format(s)
    )
    conn.execute(
        sql.SQL(
            "CREATE TABLE {}.bench_runs (job_id bigint NOT NULL, attempt integer NOT NULL,"
            " order_id bigint NOT NULL, pid integer NOT NULL,"
            " at timestamptz NOT NULL DEFAULT clock_timestamp())"
        ).format(s)
    )


def read_lines(folder: Path, kind: str) -> list[list[str]]:
    """The fields of every complete line that processes appended to `<kind>-*.txt`."""
    rows: list[list[str]] = []
    for path in sorted(folder.glob(f"{kind}-*.txt")):
        text = path.read_text()
        complete = text if text.endswith("\n") else text.rpartition("\n")[0]
        rows.extend(line.split() for line in complete.splitlines() if line)
    return rows


def backends_of(folder: Path, pid: int) -> list[int]:
    """Backend pids that worker process `pid` ran atomic jobs on."""
    path = folder / f"backends-{pid}.txt"
    if not path.exists():
        return []
    return [int(line) for line in path.read_text().split()]
