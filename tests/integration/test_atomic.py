"""Atomic tasks: the claim, the handler's writes and the completion share one transaction."""

from __future__ import annotations

import asyncio
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import ConfigurationError, JobContext, Queue, RetryPolicy, Worker
from pgqueue.testing import drain
from pgqueue.worker.rescuer import Rescuer
from tests.apps import tasks as apps
from tests.conftest import count, settings_worker_process, wait_until

# Run on each server CI tests against: exactly-once rests on the server's transactions.
pytestmark = pytest.mark.each_server


@pytest.fixture
def effects(dsn: str) -> Iterator[str]:
    """A table the handlers write to, outside the queue's schema."""
    table = f"effects_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (job_id bigint, pid int, note text)").format(
                sql.Identifier(table)
            )
        )
    yield table
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))


def _rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT job_id, note FROM {} ORDER BY job_id, note").format(
                sql.Identifier(table)
            )
        ).fetchall()


def _insert(table: str) -> sql.Composed:
    return sql.SQL("INSERT INTO {} (job_id, note) VALUES (%s, %s)").format(sql.Identifier(table))


def test_atomic_job_writes_commit_with_its_completion(queue: Queue, dsn: str, effects: str) -> None:
    @queue.task(name="charge", atomic=True)
    async def charge(order: int, ctx: JobContext) -> str:
        await ctx.connection.execute(_insert(effects), [ctx.job_id, f"order {order}"])
        return "charged"

    ids = queue.enqueue_many([charge.job(i) for i in range(5)])
    drain(queue)
    assert _rows(dsn, effects) == [(job_id, f"order {i}") for i, job_id in enumerate(ids)]
    for job_id in ids:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "succeeded" and job.result == "charged"


def test_failed_atomic_attempt_rolls_back_its_writes_but_records_the_failure(
    queue: Queue, dsn: str, effects: str
) -> None:
    @queue.task(name="flaky", atomic=True, max_attempts=3, retry=RetryPolicy(base=0, jitter=0))
    async def flaky(ctx: JobContext) -> None:
        await ctx.connection.execute(_insert(effects), [ctx.job_id, f"attempt {ctx.attempt}"])
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails after writing")

    job_id = queue.enqueue(flaky.job())
    drain(queue)
    assert _rows(dsn, effects) == [(job_id, "attempt 3")]  # only the attempt that succeeded
    job = queue.get_job(job_id)
    assert job is not None and job.status == "succeeded" and job.attempt == 3
    assert [e["error"] for e in job.errors] == [
        "RuntimeError: attempt 1 fails after writing",
        "RuntimeError: attempt 2 fails after writing",
    ]


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_an_atomic_job_whose_commit_is_refused_spends_its_attempts_and_fails(
    queue: Queue, dsn: str, effects: str, kind: str
) -> None:
    """Its writes break a deferred constraint, so the database refuses every commit: each
    refusal is a failed attempt, and the job ends failed instead of being claimed again
    forever; the next job runs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD UNIQUE (job_id, note) DEFERRABLE INITIALLY DEFERRED"
            ).format(sql.Identifier(effects))
        )
    policy = RetryPolicy(base=0, jitter=0)
    if kind == "def":

        @queue.task(name="twice", atomic=True, max_attempts=2, retry=policy)
        def twice(ctx: JobContext) -> None:
            for _ in range(2):
                ctx.connection.execute(_insert(effects), [ctx.job_id, "same"])

        @queue.task(name="once", atomic=True)
        def once(ctx: JobContext) -> None:
            ctx.connection.execute(_insert(effects), [ctx.job_id, "once"])

    else:

        @queue.task(name="twice", atomic=True, max_attempts=2, retry=policy)
        async def twice(ctx: JobContext) -> None:
            for _ in range(2):
                await ctx.connection.execute(_insert(effects), [ctx.job_id, "same"])

        @queue.task(name="once", atomic=True)
        async def once(ctx: JobContext) -> None:
            await ctx.connection.execute(_insert(effects), [ctx.job_id, "once"])

    refused = queue.enqueue(twice.job())
    fine = queue.enqueue(once.job())
    drain(queue)
    job = queue.get_job(refused)
    assert job is not None and job.status == "failed" and job.attempt == 2, job
    assert [e["type"].rsplit(".", 1)[-1] for e in job.errors] == ["UniqueViolation"] * 2
    other = queue.get_job(fine)
    assert other is not None and other.status == "succeeded", other
    assert _rows(dsn, effects) == [(fine, "once")]


def test_a_running_atomic_job_looks_queued_and_locked_and_is_never_rescued(
    queue: Queue, dsn: str, schema: str
) -> None:
    inside, release = threading.Event(), threading.Event()

    @queue.task(name="hold", atomic=True)
    async def hold() -> None:
        inside.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)

    job_id = queue.enqueue(hold.job())
    worker = Worker(queue, dsn=dsn, heartbeat_interval=0.1, lease_timeout=0.2)
    thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
    thread.start()
    try:
        assert inside.wait(30)
        with psycopg.connect(dsn) as conn:
            assert count(conn, schema, "jobs", "status = 'queued'") == 1  # uncommitted claim
            conn.commit()
            rescuer = Rescuer(queue.registry, schema, __import__("datetime").timedelta(0), True)

            async def rescue() -> int:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a:
                    return await rescuer.rescue(a)

            assert asyncio.run(rescue()) == 0
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    job = queue.get_job(job_id)
    assert job is not None and job.status == "succeeded" and job.attempt == 1


def test_a_killed_worker_s_atomic_job_is_claimable_at_once_with_its_writes_undone(
    dsn: str, schema: str, effects: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    marker = tmp_path / "first-run-started"
    (job_id,) = Queue(dsn, schema=schema).enqueue_many(
        [apps.atomic_effect.job(effects, str(marker))]
    )
    # Leases far longer than the test: only the rollback can free the job in time.
    slow_rescue = {"heartbeat_interval": 5, "lease_timeout": 600, "rescue_interval": 600}
    victim = settings_worker_process(
        dsn,
        schema,
        slow_rescue,
        log=tmp_path / "victim.log",
        env={"PGQUEUE_TEST_RUNS": str(runs)},
    )
    wait_until(marker.exists, what="the first run to write and hang")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    drain(apps.queue, dsn=dsn, schema=schema, **slow_rescue)
    rows = _rows(dsn, effects)
    assert len(rows) == 1 and rows[0][0] == job_id  # the killed run's write was rolled back
    with psycopg.connect(dsn) as conn:
        ((status, attempt),) = conn.execute(
            sql.SQL("SELECT status, attempt FROM {}.job_history").format(sql.Identifier(schema))
        ).fetchall()
    assert (status, attempt) == ("succeeded", 1)  # the crash rolled back its attempt too


def test_atomic_tasks_have_a_bounded_timeout() -> None:
    queue = Queue()

    async def handler() -> None: ...

    with pytest.raises(ConfigurationError, match="over the 0:15:00 limit"):
        queue.task(name="too_long", atomic=True, timeout=3600)(handler)
    assert queue.task(name="bounded", atomic=True)(handler).policy.timeout is not None


def test_sync_atomic_job_writes_on_a_sync_connection_and_commits_with_its_completion(
    queue: Queue, dsn: str, effects: str
) -> None:
    @queue.task(name="sync_charge", atomic=True, max_attempts=2, retry=RetryPolicy(base=0))
    def sync_charge(order: int, ctx: JobContext) -> str:
        assert isinstance(ctx.connection, psycopg.Connection)
        ctx.connection.execute(_insert(effects), [ctx.job_id, f"attempt {ctx.attempt}"])
        if order == 2 and ctx.attempt == 1:
            raise RuntimeError("rolled back with its write")
        return "charged"

    @queue.task(name="async_charge", atomic=True)
    async def async_charge(ctx: JobContext) -> str:
        await ctx.connection.execute(_insert(effects), [ctx.job_id, "async"])
        return "charged"

    ids = queue.enqueue_many([sync_charge.job(1), sync_charge.job(2), async_charge.job()])
    drain(queue)
    assert _rows(dsn, effects) == [(ids[0], "attempt 1"), (ids[1], "attempt 2"), (ids[2], "async")]
    for job_id in ids:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "succeeded" and job.result == "charged"


def test_sync_atomic_job_that_returns_past_its_timeout_is_rolled_back(
    queue: Queue, dsn: str, effects: str
) -> None:
    import time

    @queue.task(name="slow_sync", atomic=True, timeout=0.05, max_attempts=1)
    def slow_sync(ctx: JobContext) -> None:
        ctx.connection.execute(_insert(effects), [ctx.job_id, "too late"])
        time.sleep(0.2)

    job_id = queue.enqueue(slow_sync.job())
    drain(queue)
    assert _rows(dsn, effects) == []
    job = queue.get_job(job_id)
    assert job is not None and job.status == "failed"
    assert (job.last_error or "").startswith("JobTimeoutError")


def test_the_atomic_flag_survives_per_enqueue_options_and_declared_tasks(
    queue: Queue, dsn: str, schema: str
) -> None:
    @queue.task(name="atomic_t", atomic=True)
    async def atomic_t() -> None: ...

    remote = Queue(dsn, schema=schema).declare("atomic_t_remote", atomic=True)
    queue.enqueue(atomic_t.job(), delay=3600, priority=3)
    queue.enqueue(remote.job(), queue="other")
    with psycopg.connect(dsn) as conn:
        flags = conn.execute(
            sql.SQL("SELECT atomic FROM {}.jobs ORDER BY id").format(sql.Identifier(schema))
        ).fetchall()
    assert flags == [(True,), (True,)]
