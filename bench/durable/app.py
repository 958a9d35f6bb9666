"""The application the durable suite (bench/durable/suite.py) runs: in its own process (a
burst worker, for the checkpoints and the chains) and in worker processes (the waits).

Each checkpoint handler does its work `count` times bare and `count` times as a step, in
turn, and keeps both times in `state.timings`, read by the suite in the same process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgqueue import JobContext, Queue

queue = Queue()
APP_TABLE = "durable_app_rows"  # made by the suite in the bench's database
INSERT = f"INSERT INTO {APP_TABLE} (job, n) VALUES (%s, %s)"


@dataclass
class State:
    """What the suite sets before a burst worker runs these tasks in its process, and what
    the checkpoint handlers record: (bare seconds, step seconds) per (task, work)."""

    dsn: str = ""
    timings: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)


state = State()


def _measure(ctx: JobContext, count: int, work: str, do: Callable[[int], None]) -> int:
    """Run `do` bare and as a step, `count` times each, alternating which goes first."""
    pairs = state.timings.setdefault((ctx.task, work), [])
    for i in range(count):
        times: dict[bool, float] = {}
        for stepped in (False, True) if i % 2 == 0 else (True, False):
            started = time.perf_counter()
            if stepped:
                ctx.step(f"step-{i}", do, i)
            else:
                do(i)
            times[stepped] = time.perf_counter() - started
        pairs.append((times[False], times[True]))
    return count


@queue.task(name="bench.durable.checkpoints")
def checkpoints(count: int, work: str, ctx: JobContext) -> int:
    """A lease task: the INSERT on a connection of the handler's own, autocommit."""
    if work == "noop":
        return _measure(ctx, count, work, _noop)
    with psycopg.connect(state.dsn, autocommit=True) as conn:

        def insert(n: int) -> None:
            conn.execute(INSERT, [ctx.job_id, n])

        return _measure(ctx, count, work, insert)


@queue.task(name="bench.durable.checkpoints_atomic", atomic=True)
def checkpoints_atomic(count: int, work: str, ctx: JobContext) -> int:
    """An atomic task: the INSERT on the job's own connection, in its transaction."""
    return _measure(ctx, count, work, _noop if work == "noop" else _atomic_insert(ctx))


def _noop(n: int) -> None:
    return None


def _atomic_insert(ctx: JobContext) -> Callable[[int], None]:
    conn: psycopg.Connection[Any] = ctx.connection

    def insert(n: int) -> None:
        conn.execute(INSERT, [ctx.job_id, n])

    return insert


# -- ten steps in one job, against a chain of ten jobs ------------------------------------------

STEPS = 10


@queue.task(name="bench.durable.ten")
def ten(ctx: JobContext) -> None:
    """Ten no-op steps (a lease task)."""
    for i in range(STEPS):
        ctx.step(f"step-{i}", _noop, i)


@queue.task(name="bench.durable.ten_atomic", atomic=True)
def ten_atomic(ctx: JobContext) -> None:
    """Ten steps, each an INSERT committed with its record (an atomic task)."""
    insert = _atomic_insert(ctx)
    for i in range(STEPS):
        ctx.step(f"step-{i}", insert, i)


@queue.task(name="bench.durable.link")
def link(n: int) -> None:
    """One no-op job of a chain (a lease task)."""


@queue.task(name="bench.durable.link_atomic", atomic=True)
def link_atomic(n: int, ctx: JobContext) -> None:
    """One job of a chain: an INSERT committed with the job's finish (an atomic task)."""
    _atomic_insert(ctx)(n)


# -- waits ------------------------------------------------------------------------------------


@queue.task(name="bench.durable.stamp")
def stamp() -> float:
    """Returns the wall clock just before the handler returns: the waiter compares it with
    when its wait returned."""
    return time.time()


@queue.task(name="noop")
def noop(seq: int = 0, n: int = 0) -> None:
    """The jobs the suite inserts in SQL: the drained ones carry a `seq`
    (bench/throughput/claimcost.py), the parked ones an `n` (bench/durable/parked.py)."""
