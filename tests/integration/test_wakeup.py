"""Waking workers: LISTEN/NOTIFY when available, polling always, poll-only for PgBouncer."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from pgqueue import Queue, Worker
from pgqueue.worker.events import JobsClaimable
from pgqueue.worker.interest import NOTHING
from tests.conftest import committed, count, wait_until, worker_in_thread


def _listeners(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue:listen'"
    ).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def test_idle_worker_is_woken_by_notify_long_before_its_next_poll(
    queue: Queue, dsn: str, schema: str
) -> None:
    ran = threading.Event()

    @queue.task(name="t")
    def t() -> None:
        ran.set()

    worker = Worker(queue, dsn=dsn, poll_interval=60)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        wait_until(lambda: _listeners(conn) == 1, what="the listener")
        wait_until(lambda: worker.stats.claims > 0, what="the first (empty) claim")
        queue.enqueue(t.job(), conn=conn)
        conn.commit()
        # The next poll is a minute away: only the notification can start the job in time.
        assert ran.wait(20)


def test_poll_only_worker_opens_no_listener_and_still_runs_jobs(
    queue: Queue, dsn: str, schema: str
) -> None:
    ran = threading.Event()

    @queue.task(name="t")
    def t() -> None:
        ran.set()

    worker = Worker(queue, dsn=dsn, poll_only=True, poll_interval=0.05)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        wait_until(
            lambda: count(conn, schema, "workers") == 1 and committed(conn),
            what="the worker to register",
        )
        queue.enqueue(t.job(), conn=conn)
        conn.commit()
        assert ran.wait(20)
        assert _listeners(conn) == 0


def test_wake_up_that_arrives_during_a_claim_is_not_lost(
    queue: Queue, dsn: str, monkeypatch: Any
) -> None:
    # Regression (bench/throughput/suite.py saw 1 s maxima): the fetch loop set "nothing more to
    # claim" after a claim returned, erasing a wake-up that had arrived while the claim ran,
    # so the job it announced waited for the next poll. Here the poll is a minute away.
    import asyncio

    from pgqueue.worker import claimer as claimer_module

    ran = threading.Event()
    t = queue.task(name="t")(lambda: ran.set())
    armed = threading.Event()
    original = claimer_module.Claimer.claim_round

    async def claim_round(self: Any, free: int) -> Any:
        result = await original(self, free)
        if armed.is_set():
            armed.clear()
            assert worker.current.fetch_loop is not None
            woken = worker.current.fetch_loop.wakes
            await asyncio.to_thread(queue.enqueue, t.job())  # committed after the claim ran
            while (
                worker.current.fetch_loop.wakes == woken
            ):  # its wake-up arrives before this round ends
                await asyncio.sleep(0.01)
        return result

    monkeypatch.setattr(claimer_module.Claimer, "claim_round", claim_round)
    worker = Worker(queue, dsn=dsn, poll_interval=60)
    with worker_in_thread(worker, force=True):
        wait_until(
            lambda: worker.current.fetch_loop is not None and worker.current.fetch_loop.wakes >= 1,
            what="the listener's first wake-up",
        )
        # Enqueues notify only a worker that has said it waits for work (interest.py).
        wait_until(
            lambda: (
                worker.current.interest is not None
                and worker.current.interest.skipped == {"default": NOTHING}
            ),
            what="the worker to ask for every wake-up",
        )
        armed.set()
        # A round to arm: a wake-up with nothing behind it, on the worker's own loop.
        assert worker.current.events is not None
        worker.current.events.publish_threadsafe(JobsClaimable())
        assert ran.wait(20)


def test_worker_with_every_slot_busy_sleeps_instead_of_spinning(queue: Queue, dsn: str) -> None:
    # Regression: once its poll time had passed, a worker whose slots were all busy slept
    # until that past time again and again, a busy loop that burned a core until a job ended.
    started, release = threading.Event(), threading.Event()

    @queue.task(name="hold")
    def hold() -> None:
        started.set()
        release.wait(30)

    queue.enqueue(hold.job())
    worker = Worker(queue, dsn=dsn, concurrency=1, poll_interval=0.05)
    with worker_in_thread(worker):
        assert started.wait(20)
        time.sleep(0.2)  # several poll intervals past the last claim
        cpu = time.process_time()
        time.sleep(1.0)
        used = time.process_time() - cpu  # this process's CPU time, the worker's threads in it
        release.set()
    assert used < 0.5, f"the worker used {used:.2f} s of CPU in 1 s with nothing to do"
