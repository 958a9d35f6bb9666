"""Durable execution inside tasks: steps recorded and replayed, durable sleeps, signals.

Side effects are counted in a table of the test's schema, written outside the job's own
transaction for lease jobs (so a rerun would show) and on `ctx.connection` for atomic ones.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import (
    Cancellation,
    JobContext,
    JobStatus,
    Queue,
    RetryPolicy,
    SignalTimeoutError,
    Worker,
)
from pgqueue.testing import drain
from tests.conftest import wait_until, worker_in_thread

retry = RetryPolicy(base=0)


@pytest.fixture
def effects(dsn: str, schema: str) -> Iterator[str]:
    """A table of side effects: one row per run of a step (job, step, attempt)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.effects (n serial, job bigint, step text, attempt int)"
            ).format(sql.Identifier(schema))
        )
    yield schema


def record(dsn: str, schema: str, job: int, step: str, attempt: int) -> str:
    """A step's side effect, committed on a connection of its own."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.effects (job, step, attempt) VALUES (%s, %s, %s)").format(
                sql.Identifier(schema)
            ),
            [job, step, attempt],
        )
    return f"{step} done"


def ran(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT job, step, attempt FROM {}.effects ORDER BY n").format(
                sql.Identifier(schema)
            )
        ).fetchall()


def steps_of(dsn: str, schema: str, job_id: int) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT seq, name, kind, result FROM {}.job_steps WHERE job_id = %s"
                    " ORDER BY seq").format(sql.Identifier(schema)),
            [job_id],
        ).fetchall()  # fmt: skip


def status(queue: Queue, job_id: int) -> str:
    job = queue.get_job(job_id)
    assert job is not None
    return job.status.value


# -- steps --------------------------------------------------------------------------------------


def test_a_retried_job_replays_its_recorded_steps_without_running_them(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=3, retry=retry)
    def pipeline(ctx: JobContext) -> list[str]:
        got = [
            ctx.step(f"s{n}", record, dsn, schema, ctx.job_id, f"s{n}", ctx.attempt)
            for n in (1, 2, 3)
        ]
        if ctx.attempt == 1:
            raise RuntimeError("after step 3")
        got.append(ctx.step("s4", record, dsn, schema, ctx.job_id, "s4", ctx.attempt))
        return got

    job_id = queue.enqueue(pipeline.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED, job
    assert job.attempt == 2
    assert job.result == ["s1 done", "s2 done", "s3 done", "s4 done"]
    # Steps 1-3 ran once, in attempt 1; step 4 once, in attempt 2.
    assert ran(dsn, schema) == [
        (job_id, "s1", 1),
        (job_id, "s2", 1),
        (job_id, "s3", 1),
        (job_id, "s4", 2),
    ]
    assert [(seq, name, kind) for seq, name, kind, _ in steps_of(dsn, schema, job_id)] == [
        (1, "s1", "step"),
        (2, "s2", "step"),
        (3, "s3", "step"),
        (4, "s4", "step"),
    ]


def test_an_async_handler_s_steps_are_awaited_and_replayed(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)

    async def fetch(n: int, ctx: JobContext) -> dict[str, int]:
        record(dsn, schema, ctx.job_id, f"a{n}", ctx.attempt)
        return {"n": n}

    @queue.task(max_attempts=2, retry=retry)
    async def flow(ctx: JobContext) -> int:
        first = await ctx.astep("one", fetch, 1, ctx)
        second = await ctx.astep("two", fetch, 2, ctx)
        if ctx.attempt == 1:
            raise RuntimeError("after step 2")
        return first["n"] + second["n"]

    job_id = queue.enqueue(flow.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.result == 3, job
    assert ran(dsn, schema) == [(job_id, "a1", 1), (job_id, "a2", 1)]


def test_a_step_returns_its_result_as_json_on_the_first_run_as_on_a_replay(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    seen: list[Any] = []

    @queue.task(max_attempts=2, retry=retry)
    def pairs(ctx: JobContext) -> None:
        seen.append(ctx.step("pair", lambda: (1, "a")))
        if ctx.attempt == 1:
            raise RuntimeError("again")

    queue.enqueue(pairs.job())
    drain(queue, dsn=dsn)
    assert seen == [[1, "a"], [1, "a"]]  # a JSON array both times, never a tuple then a list


def test_a_step_whose_name_changed_fails_the_job_naming_both_names(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=5, retry=retry)
    def renamed(ctx: JobContext) -> None:
        ctx.step("charge", lambda: 1)
        ctx.step("ship" if ctx.attempt == 1 else "send", lambda: 2)
        if ctx.attempt == 1:
            raise RuntimeError("deploy new code")

    job_id = queue.enqueue(renamed.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.FAILED, job
    assert job.attempt == 2  # failed at once, not retried
    error = job.errors[-1]
    assert error["type"] == "pgqueue.errors.StepMismatchError"
    assert "durable call 2 is step 'send'" in error["error"]
    assert "recorded step 'ship'" in error["error"]


def test_a_step_that_returns_what_is_not_json_fails_the_job_and_records_nothing(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=3)
    def clock(ctx: JobContext) -> None:
        ctx.step("now", lambda: datetime.now(timezone.utc))

    job_id = queue.enqueue(clock.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.FAILED and job.attempt == 1, job
    assert job.errors[-1]["type"] == "pgqueue.errors.StepResultError"
    assert "step 1 'now' returned a result that cannot be recorded" in job.errors[-1]["error"]
    assert steps_of(dsn, schema, job_id) == []


def test_an_atomic_job_s_steps_commit_their_writes_exactly_once(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)
    insert = sql.SQL("INSERT INTO {}.effects (job, step, attempt) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema)
    )

    def write(ctx: JobContext, step: str) -> str:
        ctx.connection.execute(insert, [ctx.job_id, step, ctx.attempt])
        return step

    @queue.task(atomic=True, max_attempts=3, retry=retry)
    def book(ctx: JobContext) -> str:
        ctx.connection.execute(insert, [ctx.job_id, "before 1", ctx.attempt])
        ctx.step("s1", write, ctx, "s1")
        ctx.connection.execute(insert, [ctx.job_id, "between", ctx.attempt])
        ctx.step("s2", write, ctx, "s2")
        ctx.connection.execute(insert, [ctx.job_id, "after 2", ctx.attempt])
        if ctx.attempt == 1:
            raise RuntimeError("after step 2")
        return ctx.step("s3", write, ctx, "s3")

    job_id = queue.enqueue(book.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.result == "s3", job
    # What the handler wrote before each step committed with it, once; what it wrote after
    # step 2 in attempt 1 rolled back with the failure and was written again in attempt 2.
    assert ran(dsn, schema) == [
        (job_id, "before 1", 1),
        (job_id, "s1", 1),
        (job_id, "between", 1),
        (job_id, "s2", 1),
        (job_id, "after 2", 2),
        (job_id, "s3", 2),
    ]


def test_an_async_atomic_job_s_steps_commit_their_writes_exactly_once(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)
    insert = sql.SQL("INSERT INTO {}.effects (job, step, attempt) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema)
    )

    async def write(ctx: JobContext, step: str) -> str:
        await ctx.connection.execute(insert, [ctx.job_id, step, ctx.attempt])
        return step

    @queue.task(atomic=True, max_attempts=3, retry=retry)
    async def book(ctx: JobContext) -> str:
        await ctx.astep("s1", write, ctx, "s1")
        await ctx.connection.execute(insert, [ctx.job_id, "between", ctx.attempt])
        await ctx.astep("s2", write, ctx, "s2")
        if ctx.attempt == 1:
            raise RuntimeError("after step 2")
        return await ctx.astep("s3", write, ctx, "s3")

    job_id = queue.enqueue(book.job())
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "succeeded"
    assert ran(dsn, schema) == [
        (job_id, "s1", 1),
        (job_id, "between", 1),
        (job_id, "s2", 1),
        (job_id, "s3", 2),
    ]


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_an_atomic_step_whose_commit_fails_rolls_back_the_segment_and_the_job_retries(
    dsn: str, schema: str, effects: str, kind: str
) -> None:
    """The step's commit is refused (a deferred unique constraint): neither the handler's
    writes nor the record commit, the job's error is the database's, and the next attempt
    runs the step again and goes on past it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER TABLE {}.effects ADD CONSTRAINT one_step_a_job UNIQUE (job, step)"
                " DEFERRABLE INITIALLY DEFERRED"
            ).format(sql.Identifier(schema))
        )
    queue = Queue(dsn, schema=schema)
    insert = sql.SQL("INSERT INTO {}.effects (job, step, attempt) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema)
    )

    def writes(ctx: JobContext) -> list[tuple[str, int]]:
        # Twice the same (job, step) on attempt 1: the constraint refuses it at commit.
        rows = [("s1", ctx.attempt)] * (2 if ctx.attempt == 1 else 1)
        return [*rows, ("after", ctx.attempt)]

    if kind == "def":

        @queue.task(atomic=True, max_attempts=3, retry=retry)
        def book(ctx: JobContext) -> str:
            *before, after = writes(ctx)
            for step, attempt in before:
                ctx.connection.execute(insert, [ctx.job_id, step, attempt])
            ctx.step("s1", lambda: "s1")
            ctx.connection.execute(insert, [ctx.job_id, *after])
            return ctx.step("s2", lambda: "s2")

    else:

        async def value(v: str) -> str:
            return v

        @queue.task(atomic=True, max_attempts=3, retry=retry)
        async def book(ctx: JobContext) -> str:
            *before, after = writes(ctx)
            for step, attempt in before:
                await ctx.connection.execute(insert, [ctx.job_id, step, attempt])
            await ctx.astep("s1", value, "s1")
            await ctx.connection.execute(insert, [ctx.job_id, *after])
            return await ctx.astep("s2", value, "s2")

    job_id = queue.enqueue(book.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt == 2, job
    assert job.errors[0]["type"].endswith("UniqueViolation"), job.errors
    assert ran(dsn, schema) == [(job_id, "s1", 2), (job_id, "after", 2)]
    assert [(seq, name) for seq, name, _, _ in steps_of(dsn, schema, job_id)] == [
        (1, "s1"),
        (2, "s2"),
    ]
    queue.close()


def test_a_def_handler_s_step_in_an_async_handler_is_a_clear_error(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=1)
    async def wrong(ctx: JobContext) -> None:
        ctx.step("blocking", lambda: 1)

    job_id = queue.enqueue(wrong.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    assert "await ctx.astep" in job.errors[-1]["error"]


# -- sleep --------------------------------------------------------------------------------------


def test_a_sleeping_job_gives_back_its_slot_and_resumes_after_its_last_step(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=1)
    def patient(ctx: JobContext) -> str:
        ctx.step("before", record, dsn, schema, ctx.job_id, "before", ctx.attempt)
        ctx.sleep(timedelta(seconds=1))
        return ctx.step("after", record, dsn, schema, ctx.job_id, "after", ctx.attempt)

    @queue.task()
    def meanwhile(ctx: JobContext) -> None:
        record(dsn, schema, ctx.job_id, "meanwhile", ctx.attempt)

    sleeper = queue.enqueue(patient.job())
    worker = Worker(queue, dsn=dsn, concurrency=1, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: status(queue, sleeper) == "scheduled", what="the job to sleep")
        other = queue.enqueue(meanwhile.job())
        wait_until(lambda: status(queue, sleeper) == "succeeded", what="the sleeper to end")
    assert ran(dsn, schema) == [
        (sleeper, "before", 1),
        (other, "meanwhile", 1),  # its one slot was free while the first job slept
        (sleeper, "after", 1),  # no attempt spent
    ]
    (sleep_step,) = [s for s in steps_of(dsn, schema, sleeper) if s[2] == "sleep"]
    assert sleep_step[:3] == (2, "sleep", "sleep") and "until" in sleep_step[3]


def test_a_job_sleeping_until_a_time_waits_scheduled_for_it(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    when = datetime.now(timezone.utc) + timedelta(hours=1)

    @queue.task()
    async def later(ctx: JobContext) -> None:
        await ctx.asleep_until(when)

    job_id = queue.enqueue(later.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SCHEDULED and job.attempt == 0, job
    assert abs((job.run_at - when).total_seconds()) < 5


# -- signals ------------------------------------------------------------------------------------


def _waiter(queue: Queue, timeout: float | None = None) -> Any:
    @queue.task(name="waiter", max_attempts=1)
    def waiter(key: str, ctx: JobContext) -> Any:
        try:
            return {"got": ctx.wait_for_signal(key, timeout=timeout)}
        except SignalTimeoutError:
            return "timed out"

    return waiter


def test_a_signal_sent_before_the_job_waits_is_kept_for_it(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    queue.signal("order-1", {"approved": True})
    job_id = queue.enqueue(waiter.job("order-1"))
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED, job
    assert job.result == {"got": {"approved": True}}
    assert steps_of(dsn, schema, job_id)[0][:3] == (1, "order-1", "signal")


def test_a_parked_job_is_woken_by_its_signal_and_takes_it_once(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    first = queue.enqueue(waiter.job("k"))
    second = queue.enqueue(waiter.job("k"))
    worker = Worker(queue, dsn=dsn, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(
            lambda: status(queue, first) == status(queue, second) == "scheduled",
            what="both jobs to park",
        )
        queue.signal("k", 1)
        wait_until(lambda: "succeeded" in (status(queue, first), status(queue, second)),
                   what="one job to take the signal")  # fmt: skip
        queue.signal("k", 2)
        wait_until(lambda: status(queue, first) == status(queue, second) == "succeeded",
                   what="the other to take the second")  # fmt: skip
    results = sorted(str(queue.get_job(i).result) for i in (first, second))  # type: ignore[union-attr]
    assert results == ["{'got': 1}", "{'got': 2}"]  # each signal taken once
    for job_id in (first, second):
        job = queue.get_job(job_id)
        assert job is not None and job.attempt == 1  # parking spent no attempt
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            sql.SQL("SELECT (SELECT count(*) FROM {0}.signals),"
                    " (SELECT count(*) FROM {0}.signal_waits)").format(sql.Identifier(schema))
        ).fetchone()  # fmt: skip
    assert left == (0, 0)


def test_a_signal_in_a_rolled_back_transaction_is_never_delivered(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue, timeout=0)
    with psycopg.connect(dsn) as conn:
        queue.signal("k", "never", conn=conn)
        conn.rollback()
    job_id = queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.result == "timed out", job


def test_a_signal_joins_the_senders_transaction(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    job_id = queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "scheduled"  # parked
    with psycopg.connect(dsn) as conn:
        queue.signal("k", "committed", conn=conn)
        assert status(queue, job_id) == "scheduled"  # not before the commit
        conn.commit()
    assert status(queue, job_id) == "queued"  # woken by the signal's own statement
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.result == {"got": "committed"}


def test_a_wait_that_times_out_raises_and_is_recorded(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue, timeout=0.5)
    job_id = queue.enqueue(waiter.job("k"))
    worker = Worker(queue, dsn=dsn, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: status(queue, job_id) == "succeeded", what="the wait to time out")
    job = queue.get_job(job_id)
    assert job is not None and job.result == "timed out" and job.attempt == 1
    ((seq, name, kind, result),) = steps_of(dsn, schema, job_id)
    assert (seq, name, kind, result) == (1, "k", "signal", {"timeout": True})
    queue.signal("k", "late")  # kept for whoever waits next
    with psycopg.connect(dsn) as conn:
        assert conn.execute(
            sql.SQL("SELECT count(*) FROM {}.signals").format(sql.Identifier(schema))
        ).fetchone() == (1,)


def test_cancelling_a_parked_job_ends_its_wait(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    job_id = queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "scheduled"
    assert queue.cancel_job(job_id) is Cancellation.CANCELLED
    assert status(queue, job_id) == "cancelled"
    queue.signal("k", "for nobody")
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "cancelled"


def test_a_signal_key_and_payload_are_checked(dsn: str, schema: str) -> None:
    from pgqueue import ConfigurationError, InvalidArgumentsError

    queue = Queue(dsn, schema=schema)
    with pytest.raises(ConfigurationError, match="signal key"):
        queue.signal("", 1)
    with pytest.raises(InvalidArgumentsError, match="payload cannot be stored"):
        queue.signal("k", {1, 2})


def _sql_signal(conn: psycopg.Connection[Any], schema: str, key: object, payload: object) -> Any:
    row = conn.execute(
        sql.SQL("SELECT {}.signal(%s, %s::jsonb)").format(sql.Identifier(schema)),
        [key, payload],
    ).fetchone()
    assert row is not None
    return row[0]


def test_sql_signal_wakes_the_parked_job_at_its_commit_as_queue_signal_does(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    job_id = queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "scheduled"  # parked
    with psycopg.connect(dsn) as conn:
        _sql_signal(conn, schema, "k", '{"ok": true}')
        assert status(queue, job_id) == "scheduled"  # not before the commit
        conn.commit()
    assert status(queue, job_id) == "queued"  # woken by the signal's own statement
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.result == {"got": {"ok": True}}


def test_sql_signal_in_a_rolled_back_transaction_is_never_delivered(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue, timeout=0)
    with psycopg.connect(dsn) as conn:
        _sql_signal(conn, schema, "k", '"never"')
        conn.rollback()
    job_id = queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.result == "timed out", job


def test_sql_signal_without_a_payload_sends_json_null_as_queue_signal_does(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SELECT {}.signal('k')").format(sql.Identifier(schema)))
        _sql_signal(conn, schema, "k", None)
    first, second = queue.enqueue(waiter.job("k")), queue.enqueue(waiter.job("k"))
    drain(queue, dsn=dsn)
    for job_id in (first, second):
        job = queue.get_job(job_id)
        assert job is not None and job.result == {"got": None}, job


@pytest.mark.parametrize(
    ("key", "payload", "says"),
    [
        ("", "1", "a signal key is a string of 1-1000 characters, got ''"),
        (None, "1", "a signal key is a string of 1-1000 characters, got NULL"),
        ("k" * 1001, "1", "a signal key is a string of 1-1000 characters"),
        ("big", '"' + "x" * (10 * 1024 * 1024) + '"', "over the 10485760-byte limit"),
    ],
)
def test_sql_signal_refuses_what_queue_signal_refuses_and_stores_nothing(
    dsn: str, schema: str, key: str | None, payload: str, says: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=says) as refused:
            _sql_signal(conn, schema, key, payload)
        assert refused.value.sqlstate == "22023"
        assert conn.execute(
            sql.SQL("SELECT count(*) FROM {}.signals").format(sql.Identifier(schema))
        ).fetchone() == (0,)


# -- retention ----------------------------------------------------------------------------------


def test_retention_prunes_the_steps_of_jobs_it_prunes(dsn: str, schema: str) -> None:
    from pgqueue.history.retention import Cutoff, prune

    queue = Queue(dsn, schema=schema)

    @queue.task()
    def short(ctx: JobContext) -> None:
        ctx.step("only", lambda: 1)

    job_id = queue.enqueue(short.job())
    drain(queue, dsn=dsn)
    assert len(steps_of(dsn, schema, job_id)) == 1  # history keeps them
    with psycopg.connect(dsn, autocommit=True) as conn:
        report = prune(conn, schema, Cutoff(timedelta(0)), now=datetime.now(timezone.utc)
                       + timedelta(seconds=1))  # fmt: skip
    assert report.deleted == 1 and report.steps_deleted == 1
    assert steps_of(dsn, schema, job_id) == []


def test_an_async_queue_sends_signals_as_the_sync_one_does(dsn: str, schema: str) -> None:
    import asyncio

    from pgqueue import AsyncQueue

    queue = Queue(dsn, schema=schema)
    waiter = _waiter(queue)
    job_id = queue.enqueue(waiter.job("async-k"))
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "scheduled"

    async def send() -> None:
        sender = AsyncQueue(dsn, schema=schema)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await sender.signal("async-k", [1, 2], conn=conn)
        await sender.close()

    asyncio.run(send())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.result == {"got": [1, 2]}, job


def test_a_def_handler_stops_at_its_next_step_once_its_cancellation_is_requested(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)
    started = threading.Event()

    def until_cancelled(ctx: JobContext) -> int:
        started.set()
        wait_until(lambda: ctx.cancel_requested, what="the worker to hear the cancel")
        return 1

    @queue.task()
    def two_steps(ctx: JobContext) -> None:
        ctx.step("one", until_cancelled, ctx)
        ctx.step("two", record, dsn, schema, ctx.job_id, "two", ctx.attempt)

    job_id = queue.enqueue(two_steps.job())
    worker = Worker(queue, dsn=dsn, poll_interval=0.1)
    with worker_in_thread(worker):
        assert started.wait(60)
        assert queue.cancel_job(job_id) is Cancellation.REQUESTED
        wait_until(lambda: status(queue, job_id) == "cancelled", what="the job to end")
    assert ran(dsn, schema) == []  # step two never ran
    assert [name for _, name, _, _ in steps_of(dsn, schema, job_id)] == ["one"]


def test_an_atomic_job_that_parks_and_sleeps_writes_each_row_once(
    dsn: str, schema: str, effects: str
) -> None:
    queue = Queue(dsn, schema=schema)
    insert = sql.SQL("INSERT INTO {}.effects (job, step, attempt) VALUES (%s, %s, %s)").format(
        sql.Identifier(schema)
    )

    def write(ctx: JobContext, step: str) -> str:
        ctx.connection.execute(insert, [ctx.job_id, step, ctx.attempt])
        return step

    @queue.task(atomic=True)
    def approve(ctx: JobContext) -> Any:
        ctx.step("before", write, ctx, "before")
        ctx.connection.execute(insert, [ctx.job_id, "waiting", ctx.attempt])
        got = ctx.wait_for_signal("atomic-k")  # parks: "waiting" rolls back, runs again later
        ctx.sleep(0.2)  # commits with its record; the job then runs again after it
        return ctx.step("after", lambda: got)

    job_id = queue.enqueue(approve.job())
    drain(queue, dsn=dsn)
    assert status(queue, job_id) == "scheduled"
    assert [s for _, s, _ in ran(dsn, schema)] == ["before"]
    queue.signal("atomic-k", "yes")
    worker = Worker(queue, dsn=dsn, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: status(queue, job_id) == "succeeded", what="the job to end")
    job = queue.get_job(job_id)
    assert job is not None and job.result == "yes" and job.attempt == 1, job
    assert [s for _, s, _ in ran(dsn, schema)] == ["before", "waiting"]
    assert [kind for _, _, kind, _ in steps_of(dsn, schema, job_id)] == [
        "step",
        "signal",
        "sleep",
        "step",
    ]
