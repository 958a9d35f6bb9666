"""Connection faults: workers ride out terminated backends and server restarts, lose no job,
never crash-loop, log once per outage, and listen again after reconnecting."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import JobContext, Queue, Worker
from pgqueue.migrate import apply
from tests.conftest import committed, count, wait_until, worker_in_thread


def _terminate(conn: psycopg.Connection[Any], application: str) -> int:
    rows = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name LIKE %s AND datname = current_database()",  # this test's own
        [application],
    ).fetchall()
    return len(rows)


def _finished(conn: psycopg.Connection[Any], schema: str) -> int:
    return count(conn, schema, "job_history")


def _pids(conn: psycopg.Connection[Any], application: str) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND datname = current_database()",
        [application],
    ).fetchall()
    return {row[0] for row in rows}


def test_worker_rides_out_terminated_backends_without_losing_or_repeating_a_job(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    dsn, schema = own_database, "pgqueue"
    with psycopg.connect(dsn, autocommit=True) as conn:
        apply(conn, schema)
    queue = Queue(dsn, schema=schema)
    runs: Counter[int] = Counter()

    @queue.task(name="t")
    async def t(i: int) -> None:
        runs[i] += 1
        await asyncio.sleep(0.001)

    jobs = 3000
    queue.enqueue_many([t.job(i) for i in range(jobs)])
    caplog.set_level(logging.WARNING, logger="pgqueue")
    worker = Worker(queue, dsn=dsn, concurrency=8, heartbeat_interval=0.2)
    with worker_in_thread(worker), psycopg.connect(dsn, autocommit=True) as admin:
        for round_ in range(1, 6):
            wait_until(lambda r=round_: _finished(admin, schema) >= r * 300, what="progress")
            assert _terminate(admin, "pgqueue:%") >= 2
        wait_until(lambda: _finished(admin, schema) == jobs, what="all jobs", timeout=120)
        assert count(admin, schema, "job_history", "status <> 'succeeded'") == 0
        assert count(admin, schema, "jobs") == 0
    queue.close()
    assert sorted(runs) == list(range(jobs)) and max(runs.values()) == 1
    lost = [r for r in caplog.records if "connection lost" in r.getMessage()]
    assert 1 <= len(lost) <= 5 * 4, len(lost)  # once per outage per connection, not per job


def test_worker_listens_again_after_its_listener_backend_is_terminated(
    own_database: str,
) -> None:
    dsn = own_database
    with psycopg.connect(dsn, autocommit=True) as conn:
        apply(conn, "pgqueue")
    queue = Queue(dsn)
    ran = threading.Event()

    @queue.task(name="t")
    def t() -> None:
        ran.set()

    worker = Worker(queue, dsn=dsn, poll_interval=60)
    with worker_in_thread(worker), psycopg.connect(dsn, autocommit=True) as admin:
        wait_until(lambda: len(_pids(admin, "pgqueue:listen")) == 1, what="the listener")
        (old,) = _pids(admin, "pgqueue:listen")
        _terminate(admin, "pgqueue:listen")
        wait_until(lambda: _pids(admin, "pgqueue:listen") - {old}, what="a new listener")
        wait_until(lambda: worker.stats.claims >= 2, what="the wake-up claim after relisten")
        queue.enqueue(t.job())
        assert ran.wait(20)  # the next poll is a minute away: only NOTIFY can do this
    queue.close()


def test_worker_rides_out_a_server_restart(server_folder: Path) -> None:
    from pgqueue import embedded

    server = embedded.start(server_folder / "restarting")  # its own server: others are unaffected
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            apply(conn, "pgqueue")
        queue = Queue(server.dsn)
        done: Counter[int] = Counter()

        @queue.task(name="t")
        async def t(i: int) -> None:
            done[i] += 1

        queue.enqueue_many([t.job(i) for i in range(500)])
        worker = Worker(queue, dsn=server.dsn, concurrency=4, heartbeat_interval=0.2)
        with worker_in_thread(worker):
            wait_until(lambda: len(done) >= 100, what="some progress")
            server.restart()
            queue.close()  # its pooled connections died with the server
            queue.enqueue_many([t.job(i) for i in range(500, 600)])
            wait_until(lambda: len(done) == 600, what="every job, old and new", timeout=120)
        queue.close()
        assert max(done.values()) == 1
    finally:
        server.stop()


def test_jobs_claimed_earlier_in_a_round_are_not_orphans_when_the_next_claim_breaks(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (found by bench/chaos/suite.py): when a claim round's later claim hit a broken
    connection, the jobs its earlier claim had returned were put back as orphans while the
    worker ran them, and they ran twice. Two queues make a round of two claims; the fault is
    real (the claim backend is terminated), the patch only times it: just before the round's
    second claim, once the first has returned jobs."""
    from pgqueue.worker import claimer as claimer_module

    dsn = own_database
    with psycopg.connect(dsn, autocommit=True) as conn:
        apply(conn, "pgqueue")
    queue = Queue(dsn)
    runs: Counter[int] = Counter()

    @queue.task(name="t")
    async def t(i: int) -> None:
        runs[i] += 1
        await asyncio.sleep(0.2)

    armed, fired = threading.Event(), threading.Event()
    returned_this_round = [0]
    original_round = claimer_module.Claimer.claim_round
    original_claim = claimer_module.Claimer._claim

    async def round_(self: Any, free: int) -> Any:
        returned_this_round[0] = 0
        return await original_round(self, free)

    async def claim(self: Any, name: str, after: Any, before: Any, limit: int) -> Any:
        if armed.is_set() and returned_this_round[0] > 0:
            armed.clear()
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [self.link.conn.info.backend_pid])
            fired.set()
        jobs = await original_claim(self, name, after, before, limit)
        returned_this_round[0] += len(jobs)
        return jobs

    monkeypatch.setattr(claimer_module.Claimer, "claim_round", round_)
    monkeypatch.setattr(claimer_module.Claimer, "_claim", claim)
    # Both jobs wait before the worker starts, so its first round claims them both; jobs
    # committed while a round is under way could fall into two rounds, and nothing would fire.
    with psycopg.connect(dsn) as conn:
        queue.enqueue(t.job(1), conn=conn, queue="a")
        queue.enqueue(t.job(2), conn=conn, queue="b")
    armed.set()
    worker = Worker(queue, dsn=dsn, queues=("a", "b"), poll_interval=60)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        wait_until(fired.is_set, what="the fault between the round's two claims")
        wait_until(lambda: _finished(conn, "pgqueue") == 2 and committed(conn), 20, "both jobs")
    queue.close()
    assert dict(runs) == {1: 1, 2: 1}


def test_atomic_jobs_keep_running_after_a_server_restart(server_folder: Path) -> None:
    """Regression (found by bench/chaos/suite.py): an atomic lane whose reconnect failed while the
    server was down died silently, and atomic jobs were never run again. What an atomic job
    promises is exactly-once effects in the database: a handler cut off by the restart before
    its commit runs again, but its write lands once."""
    from pgqueue import embedded

    server = embedded.start(server_folder / "restarting-atomic")
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            apply(conn, "pgqueue")
            conn.execute("CREATE TABLE effects (i int NOT NULL)")
        queue = Queue(server.dsn)
        calls: Counter[int] = Counter()

        @queue.task(name="a", atomic=True)
        async def a(i: int, ctx: JobContext) -> None:
            calls[i] += 1
            await ctx.connection.execute("INSERT INTO effects VALUES (%s)", [i])

        def effects() -> Counter[int]:
            with psycopg.connect(server.dsn) as conn:
                return Counter(row[0] for row in conn.execute("SELECT i FROM effects"))

        queue.enqueue_many([a.job(i) for i in range(200)])
        worker = Worker(queue, dsn=server.dsn, heartbeat_interval=0.2, atomic_concurrency=2)
        with worker_in_thread(worker):
            wait_until(lambda: len(calls) >= 20, what="some atomic progress")
            server.restart()
            queue.close()
            queue.enqueue_many([a.job(i) for i in range(200, 260)])
            wait_until(lambda: len(effects()) == 260, what="every atomic job", timeout=120)
        queue.close()
        assert max(effects().values()) == 1  # each effect exactly once
        assert min(calls.values()) >= 1
    finally:
        server.stop()
