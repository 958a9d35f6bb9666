"""Worker behaviour on a real database: order, scheduling, retries, history, bad rows."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from pgqueue import JobContext, Queue, RetryPolicy, Worker
from pgqueue.testing import drain, enqueued_jobs
from tests.conftest import count

NO_WAIT = RetryPolicy(base=0, jitter=0)


class Point(BaseModel):
    x: int
    y: int


def _insert_raw(
    conn: psycopg.Connection[Any], schema: str, task: str, args: str, max_attempts: int = 1
) -> int:
    """A job row written by other means than pgqueue (another service, psql, an old version)."""
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, max_attempts) "
            "VALUES ('default', %s, %s::jsonb, %s) RETURNING id"
        ).format(sql.Identifier(schema)),
        [task, args, max_attempts],
    ).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


def test_worker_runs_jobs_in_priority_then_id_order(queue: Queue, conn: Any) -> None:
    order: list[str] = []

    @queue.task(name="t")
    def t(label: str) -> None:
        order.append(label)

    jobs = [t.job("p5-a"), t.job("p0-a"), t.job("p-3"), t.job("p0-b"), t.job("p5-b")]
    priorities = [5, 0, -3, 0, 5]
    for job, priority in zip(jobs, priorities, strict=False):
        queue.enqueue(job, conn=conn, priority=priority)
    conn.commit()
    drain(queue, concurrency=1)
    assert order == ["p-3", "p0-a", "p0-b", "p5-a", "p5-b"]


def test_worker_leaves_jobs_alone_until_their_run_at(queue: Queue, conn: Any, schema: str) -> None:
    ran: list[int] = []

    @queue.task(name="t")
    def t(i: int) -> None:
        ran.append(i)

    later = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue(t.job(1), conn=conn, run_at=later)
    queue.enqueue(t.job(2), conn=conn, delay=timedelta(minutes=5))
    queue.enqueue(t.job(3), conn=conn)
    conn.commit()
    drain(queue)
    assert ran == [3]
    assert {j.status for j in enqueued_jobs(conn, queue)} == {"scheduled"}
    # Time passes: move the first job's run_at into the past instead of sleeping.
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET run_at = now() - interval '1 second' WHERE args->>'i' = '1'"
        ).format(sql.Identifier(schema))
    )
    conn.commit()
    drain(queue)
    assert ran == [3, 1]
    assert [j.args for j in enqueued_jobs(conn, queue)] == [{"i": 2}]


def test_failing_job_is_retried_then_failed_with_errors_and_timings(
    queue: Queue, conn: Any, schema: str
) -> None:
    attempts: list[int] = []

    @queue.task(name="flaky", max_attempts=3, retry=NO_WAIT)
    def flaky(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError(f"boom on attempt {ctx.attempt}")

    job_id = queue.enqueue(flaky.job(), conn=conn)
    conn.commit()
    drain(queue)
    assert attempts == [1, 2, 3]
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "failed" and job.attempt == 3
    assert [e["error"] for e in job.errors] == [
        f"RuntimeError: boom on attempt {n}" for n in (1, 2, 3)
    ]
    assert "Traceback" in job.errors[-1]["traceback"]
    assert job.started_at is not None and job.finished_at is not None
    assert job.created_at <= job.started_at <= job.finished_at
    assert job.run_time is not None and job.wait_time is not None
    assert count(conn, schema, "jobs") == 0


def test_retry_waits_for_its_backoff_before_running_again(queue: Queue, conn: Any) -> None:
    @queue.task(name="t", max_attempts=5, retry=RetryPolicy(base=3600, jitter=0))
    def t() -> None:
        raise ValueError("later")

    job_id = queue.enqueue(t.job(), conn=conn)
    conn.commit()
    drain(queue)
    (job,) = enqueued_jobs(conn, queue)
    assert job.id == job_id and job.status == "scheduled" and job.attempt == 1
    assert job.run_at - datetime.now(timezone.utc) > timedelta(minutes=55)
    assert job.last_error == "ValueError: later"


def test_succeeded_job_keeps_result_and_timings_in_history(queue: Queue, conn: Any) -> None:
    @queue.task(name="t")
    async def t(x: int) -> dict[str, int]:
        return {"double": 2 * x}

    job_id = queue.enqueue(t.job(21), conn=conn)
    conn.commit()
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "succeeded" and job.result == {"double": 42} and job.attempt == 1
    assert job.worker_id is not None and job.run_time is not None
    assert job.finished_at is not None and job.started_at is not None
    assert job.finished_at >= job.started_at


def test_history_off_deletes_finished_jobs(dsn: str, schema: str, conn: Any) -> None:
    queue = Queue(dsn, schema=schema, keep_history=False)
    t = queue.task(name="t")(lambda: None)
    queue.enqueue(t.job(), conn=conn)
    conn.commit()
    drain(queue)
    assert count(conn, schema, "jobs") == 0
    assert count(conn, schema, "job_history") == 0


def test_unregistered_task_row_fails_with_reason_and_worker_lives_on(
    queue: Queue, conn: Any, schema: str
) -> None:
    ran: list[int] = []

    @queue.task(name="ok")
    def ok(i: int) -> None:
        ran.append(i)

    bad = _insert_raw(conn, schema, "somebody.elses_task", '{"x": 1}')
    for i in range(5):
        queue.enqueue(ok.job(i), conn=conn)
    conn.commit()
    drain(queue, concurrency=2)
    assert sorted(ran) == [0, 1, 2, 3, 4]
    job = queue.get_job(bad)
    assert job is not None and job.status == "failed"
    assert "no task is registered under 'somebody.elses_task'" in (job.last_error or "")


def test_row_with_arguments_that_no_longer_validate_fails_without_retry(
    queue: Queue, conn: Any, schema: str
) -> None:
    @queue.task(name="t", max_attempts=10)
    def t(user_id: int) -> None: ...

    bad = _insert_raw(conn, schema, "t", json.dumps({"user_id": "abc"}), max_attempts=10)
    drain(queue)
    job = queue.get_job(bad)
    assert job is not None and job.status == "failed" and job.attempt == 1
    assert "stored arguments no longer validate" in (job.last_error or "")


def test_stored_json_is_parsed_back_to_declared_types(queue: Queue, conn: Any) -> None:
    seen: list[Any] = []

    @queue.task(name="t")
    def t(when: datetime, where: Point, tags: list[str], limit: int = 3) -> None:
        seen.extend([when, where, tags, limit])

    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    queue.enqueue(t.job(moment, Point(x=1, y=2), ["a"]), conn=conn)
    conn.commit()
    drain(queue)
    assert seen == [moment, Point(x=1, y=2), ["a"], 3]


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_handler_raising_exit_or_interrupt_fails_the_job_not_the_worker(
    queue: Queue, conn: Any, exc: BaseException
) -> None:
    ran: list[str] = []

    @queue.task(name="bad", max_attempts=1)
    def bad() -> None:
        raise exc

    @queue.task(name="abad", max_attempts=1)
    async def abad() -> None:
        raise exc

    @queue.task(name="good")
    def good() -> None:
        ran.append("good")

    ids = [queue.enqueue(bad.job(), conn=conn), queue.enqueue(abad.job(), conn=conn)]
    queue.enqueue(good.job(), conn=conn)
    conn.commit()
    drain(queue, concurrency=1)
    assert ran == ["good"]
    for job_id in ids:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "failed"
        assert (job.last_error or "").startswith(type(exc).__name__)


def test_sync_and_async_handlers_run_in_one_worker(queue: Queue, conn: Any) -> None:
    seen: list[str] = []

    @queue.task(name="s")
    def s(i: int) -> None:
        seen.append(f"s{i}")

    @queue.task(name="a")
    async def a(i: int) -> None:
        await asyncio.sleep(0)
        seen.append(f"a{i}")

    queue.enqueue_many([s.job(i) for i in range(20)] + [a.job(i) for i in range(20)], conn=conn)
    conn.commit()
    drain(queue, concurrency=8)
    assert sorted(seen) == sorted([f"s{i}" for i in range(20)] + [f"a{i}" for i in range(20)])


def test_worker_only_claims_its_own_queues(queue: Queue, conn: Any) -> None:
    ran: list[str] = []

    @queue.task(name="t")
    def t(q: str) -> None:
        ran.append(q)

    for name in ("a", "b", "c"):
        queue.enqueue(t.job(name), conn=conn, queue=name)
    conn.commit()
    drain(queue, queues=("a", "c"))
    assert sorted(ran) == ["a", "c"]
    assert [j.queue for j in enqueued_jobs(conn, queue)] == ["b"]


def test_only_the_claim_connection_commits_asynchronously(queue: Queue, dsn: str) -> None:
    """Lease claims may commit without a WAL flush (worker.py, _claim_session); outcomes and
    atomic lanes, whose commits carry results and the handler's writes, may not."""
    seen: dict[str, str] = {}
    running: list[Worker] = []

    async def show(conn: Any) -> str:
        cur = await conn.execute("SHOW synchronous_commit")
        row = await cur.fetchone()
        return str(row[0])

    @queue.task(name="lease")
    async def lease() -> None:
        worker = running[0]
        seen["claim"] = await worker._claims.run(show)
        seen["complete"] = await worker.completer.link.run(show)

    @queue.task(name="atomic_async", atomic=True)
    async def atomic_async(ctx: JobContext) -> None:
        seen["atomic_async"] = await show(ctx.connection)

    @queue.task(name="atomic_sync", atomic=True)
    def atomic_sync(ctx: JobContext) -> None:
        row = ctx.connection.execute("SHOW synchronous_commit").fetchone()
        seen["atomic_sync"] = str(row[0])

    queue.enqueue_many([lease.job(), atomic_async.job(), atomic_sync.job()])
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
        assert row is not None
        default = str(row[0])
    assert default == "on"  # the test means nothing on a server that never flushes
    running.append(Worker(queue, dsn=dsn, burst=True))
    asyncio.run(running[0].run_async())
    assert seen == {
        "claim": "off",
        "complete": default,
        "atomic_async": default,
        "atomic_sync": default,
    }
