"""Waking workers: LISTEN/NOTIFY when available, polling always, poll-only for PgBouncer."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from pgqueue import Queue, Worker
from tests.conftest import count, wait_until, worker_in_thread


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
            lambda: count(conn, schema, "workers") == 1 and not conn.commit(),
            what="the worker to register",
        )
        queue.enqueue(t.job(), conn=conn)
        conn.commit()
        assert ran.wait(20)
        assert _listeners(conn) == 0
