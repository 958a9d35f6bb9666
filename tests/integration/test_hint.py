"""The claim hint never starves a job (seed 002's lock jitter).

Workers claim after the last (priority, id) they took. A job committed late with a lower id,
or a scheduled job that falls due after the hint passed it, sits below the hint; it must still
be claimed within one hint reset interval while the queue stays busy. The control run, with
the reset effectively disabled, shows the same job waits for the whole backlog: the test can
tell the difference.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker
from pgqueue.testing import drain
from tests.conftest import wait_until, worker_in_thread

BACKLOG = 400


def _tasks(queue: Queue) -> tuple[Any, Any, list[str], threading.Event, threading.Event]:
    order: list[str] = []
    warmed = threading.Event()
    special_ran = threading.Event()

    @queue.task(name="busy")
    def busy(i: int) -> None:
        time.sleep(0.01)
        order.append(f"b{i}")
        if len(order) >= 20:
            warmed.set()

    @queue.task(name="special")
    def special(label: str) -> None:
        order.append(label)
        special_ran.set()

    return busy, special, order, warmed, special_ran


@contextmanager
def _held_snapshot(dsn: str, queue: Queue) -> Iterator[None]:
    """A REPEATABLE READ snapshot held idle while 2,000 jobs run and finish in front of it:
    their dead index entries cannot be cleaned, as under a long transaction (seed 002)."""
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        churn = queue.task(name="churn")(lambda: None)
        queue.enqueue_many([churn.job() for _ in range(2000)])
        drain(queue, concurrency=50)
        yield
        holder.rollback()


def _late_commit_run(
    queue: Queue, dsn: str, reset_seconds: float, hold: bool = False
) -> tuple[int, int]:
    """(busy jobs done before the late job ran, busy jobs done when the job was committed)."""
    with _held_snapshot(dsn, queue) if hold else contextlib.nullcontext():
        return _late_commit(queue, dsn, reset_seconds)


def _late_commit(queue: Queue, dsn: str, reset_seconds: float) -> tuple[int, int]:
    busy, special, order, warmed, special_ran = _tasks(queue)
    with psycopg.connect(dsn) as late, psycopg.connect(dsn) as other:
        late_id = queue.enqueue(special.job("late"), conn=late)  # lowest id, not committed
        ids = queue.enqueue_many([busy.job(i) for i in range(BACKLOG)], conn=other)
        other.commit()
        assert late_id < min(ids)
        worker = Worker(
            queue,
            dsn=dsn,
            concurrency=1,
            hint_reset_interval=reset_seconds,
            hint_reset_jitter=0.5,
            poll_interval=0.2,
        )
        with worker_in_thread(worker, force=True):
            assert warmed.wait(30)
            late.commit()
            committed_at = len(order)
            assert special_ran.wait(60)
            # Every due job is found, not only the late one.
            wait_until(lambda: len(order) == BACKLOG + 1, what="the whole backlog")
            assert sorted(order) == sorted(["late"] + [f"b{i}" for i in range(BACKLOG)])
            return order.index("late"), committed_at


@pytest.mark.parametrize("hold", [False, True], ids=["plain", "snapshot-held"])
def test_job_committed_late_below_the_hint_runs_within_the_reset_interval(
    queue: Queue, dsn: str, hold: bool
) -> None:
    # Held: 2,000 dead entries sit in the claim index and the late job's id is below them all.
    ran_at, committed_at = _late_commit_run(queue, dsn, reset_seconds=0.2, hold=hold)
    # Busy jobs take 10 ms each: one reset (0.2 s +- 50%) is about 30 jobs, not 380.
    assert ran_at - committed_at < 150, (ran_at, committed_at)


def test_control_without_reset_the_late_job_waits_for_the_whole_backlog(
    queue: Queue, dsn: str
) -> None:
    ran_at, _ = _late_commit_run(queue, dsn, reset_seconds=3600)
    assert ran_at >= BACKLOG - 1


def test_scheduled_job_falling_due_after_the_hint_passed_it_runs_within_reset(
    queue: Queue, dsn: str, schema: str
) -> None:
    busy, special, order, warmed, special_ran = _tasks(queue)
    with psycopg.connect(dsn) as conn:
        due_id = queue.enqueue(special.job("due"), conn=conn, delay=timedelta(hours=1))
        queue.enqueue_many([busy.job(i) for i in range(BACKLOG)], conn=conn)
        conn.commit()
        worker = Worker(queue, dsn=dsn, concurrency=1, hint_reset_interval=0.2, poll_interval=0.1)
        with worker_in_thread(worker, force=True):
            assert warmed.wait(30)
            conn.execute(
                sql.SQL("UPDATE {}.jobs SET run_at = now() WHERE id = %s").format(
                    sql.Identifier(schema)
                ),
                [due_id],
            )
            conn.commit()
            due_at = len(order)
            assert special_ran.wait(60)
    assert order.index("due") - due_at < 150, (order.index("due"), due_at)
