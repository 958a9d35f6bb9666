"""Waiting for a job's result: Queue.wait, wait_many and as_completed, and their async twins,
against real PostgreSQL and real workers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import (
    AsyncQueue,
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    JobStatus,
    Queue,
    WaitSettings,
    WaitTimeoutError,
    Worker,
    chain,
    group,
)
from pgqueue.queries import query
from pgqueue.testing import adrain, drain
from tests.conftest import wait_until, worker_in_thread

# Run on each server CI tests against: waits LISTEN on the server.
pytestmark = pytest.mark.each_server

HOUR = 3600.0


@contextlib.contextmanager
def working(queue: Queue) -> Iterator[Worker]:
    """A worker running the queue's jobs (its tasks registered by now), in a thread."""
    assert queue.dsn is not None
    with worker_in_thread(Worker(queue, dsn=queue.dsn, poll_interval=0.05)) as running:
        yield running


def _rows(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        table = sql.SQL("SELECT count(*) FROM {}.result_waiters").format(sql.Identifier(schema))
        row = conn.execute(table).fetchone()
    return int(row[0]) if row else -1


def _only_notices(queue: Queue) -> None:
    """Waits of `queue` hear of a finish only by its notice: their poll is an hour away."""
    queue.wait_settings = WaitSettings(poll_interval=HOUR)


def test_wait_returns_the_result_a_worker_stored(queue: Queue) -> None:
    double = queue.task(name="double")(lambda n: {"n": n * 2})
    _only_notices(queue)
    with working(queue):
        job_id = double.enqueue(21)
        assert queue.wait(job_id, timeout=60) == {"n": 42}


def test_a_failed_job_raises_its_type_message_and_traceback(queue: Queue) -> None:
    def explode(n: int) -> None:
        raise ValueError(f"bad {n}")

    task = queue.task(name="explode", max_attempts=1)(explode)
    _only_notices(queue)
    with working(queue), pytest.raises(JobFailedError, match="bad 7") as caught:
        job_id = task.enqueue(7)
        queue.wait(job_id, timeout=60)
    failure = caught.value
    assert failure.job_id == job_id
    assert failure.error_type == "builtins.ValueError"
    assert failure.error == "ValueError: bad 7"
    assert "in explode" in failure.traceback and "ValueError: bad 7" in failure.traceback
    assert len(failure.errors) == 1


def test_a_cancelled_job_raises_cancellation_to_a_wait_in_progress(queue: Queue) -> None:
    later = queue.task(name="later")(lambda: None)
    _only_notices(queue)
    job_id = later.with_options(delay=HOUR).enqueue()
    outcome: list[BaseException] = []

    def waiting() -> None:
        try:
            queue.wait(job_id, timeout=60)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=waiting)
    waiter.start()
    wait_until(lambda: _rows(queue.dsn or "", queue.schema) == 1, what="the wait's row")
    queue.cancel_job(job_id)
    waiter.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], JobCancelledError)
    assert outcome[0].job_id == job_id


def test_a_timeout_raises_and_leaves_the_job_alone(queue: Queue) -> None:
    later = queue.task(name="later")(lambda: 5)
    job_id = later.with_options(delay=HOUR).enqueue()
    with pytest.raises(WaitTimeoutError, match=str(job_id)) as caught:
        queue.wait(job_id, timeout=timedelta(milliseconds=200))
    assert isinstance(caught.value, TimeoutError) and caught.value.job_ids == [job_id]
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SCHEDULED and job.attempt == 0


def test_a_job_finished_before_the_wait_is_read_from_history(queue: Queue) -> None:
    answer = queue.task(name="answer")(lambda: [1, "two", None])
    job_id = answer.enqueue()
    drain(queue)
    _only_notices(queue)  # nothing will notify: the first read finds it
    assert queue.wait(job_id, timeout=60) == [1, "two", None]
    assert queue.wait(queue.get_job(job_id), timeout=60) == [1, "two", None]  # type: ignore[arg-type]


def test_without_notices_polling_still_delivers(queue: Queue) -> None:
    """listen=False (PgBouncer's transaction mode): no row, no notice, only the poll."""
    queue.wait_settings = WaitSettings(listen=False, poll_interval=0.05)
    plus = queue.task(name="plus")(lambda a, b: a + b)
    with working(queue):
        job_id = plus.enqueue(2, 3)
        assert queue.wait(job_id, timeout=60) == 5
    assert _rows(queue.dsn or "", queue.schema) == 0


def test_a_lost_notice_is_made_up_by_the_poll(queue: Queue, dsn: str, schema: str) -> None:
    """A job finished by a statement that notifies no one (here, moved by hand) is still
    found by the next poll."""
    queue.wait_settings = WaitSettings(poll_interval=0.05)
    later = queue.task(name="later")(lambda: None)
    job_id = later.with_options(delay=HOUR).enqueue()
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queue.wait(job_id, timeout=60)))
    waiter.start()
    wait_until(lambda: _rows(dsn, schema) == 1, what="the wait's row")
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL(
                "WITH gone AS (DELETE FROM {s}.jobs WHERE id = %(id)s RETURNING *) "
                "INSERT INTO {s}.job_history (id, queue, task, args, status, priority, attempt,"
                " max_attempts, run_at, created_at, finished_at, errors, result) "
                "SELECT id, queue, task, args, 'succeeded', priority, 1, max_attempts, run_at,"
                " created_at, now(), errors, '\"by hand\"' FROM gone"
            ).format(s=sql.Identifier(schema)),
            {"id": job_id},
        )
    waiter.join(timeout=60)
    assert got == ["by hand"]


def test_a_finish_nobody_waits_for_sends_no_notice(queue: Queue, dsn: str, schema: str) -> None:
    task = queue.task(name="t")(lambda n: n)
    unwatched = task.enqueue(1)
    drain(queue)
    watched = task.enqueue(2)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(query("wait_listen", schema))
        listener.execute(query("wait_register", schema), {"ids": [watched]})
        drain(queue)
        heard = []
        for note in listener.notifies(timeout=60):
            heard.append(int(note.payload))
            if int(note.payload) == watched:
                break
        listener.execute(query("wait_unregister", schema), {"ids": None})
    assert heard == [watched] and unwatched not in heard


def test_a_thousand_async_waiters_share_one_connection(dsn: str, schema: str) -> None:
    async def scenario() -> None:
        queue = AsyncQueue(dsn, schema=schema)
        queue.wait_settings = WaitSettings(poll_interval=HOUR)
        square = queue.task(name="square")(lambda n: n * n)
        ids = await queue.enqueue_many([square.job(n) for n in range(1000)])
        waits = [asyncio.ensure_future(queue.wait(i, timeout=120)) for i in ids]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
            rows = sql.SQL("SELECT count(*), count(DISTINCT pid) FROM {}.result_waiters")
            while (await (await watch.execute(rows.format(sql.Identifier(schema)))).fetchone()) != (
                1000,
                1,
            ):
                await asyncio.sleep(0.02)
            sessions = await watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue:wait'"
                " AND datname = current_database()"
            )
            assert await sessions.fetchone() == (1,)
        await adrain(queue, concurrency=50)
        assert await asyncio.gather(*waits) == [n * n for n in range(1000)]
        await queue.close()

    asyncio.run(scenario())
    assert _rows(dsn, schema) == 0


def test_wait_many_returns_results_in_the_order_given(queue: Queue) -> None:
    echo = queue.task(name="echo")(lambda v: v)
    ids = [echo.enqueue(v) for v in ("a", "b", "c")]
    drain(queue)
    assert queue.wait_many(list(reversed(ids)), timeout=60) == ["c", "b", "a"]
    assert queue.wait_many([ids[0], ids[0]], timeout=60) == ["a", "a"]
    assert queue.wait_many([], timeout=60) == []


def test_wait_many_raises_the_first_failure_or_returns_it_in_place(queue: Queue) -> None:
    def fail() -> None:
        raise KeyError("gone")

    ok = queue.task(name="ok")(lambda: "fine")
    bad = queue.task(name="bad", max_attempts=1)(fail)
    ids = [ok.enqueue(), bad.enqueue()]
    drain(queue)
    with pytest.raises(JobFailedError, match="KeyError"):
        queue.wait_many(ids, timeout=60)
    fine, failure = queue.wait_many(ids, timeout=60, return_exceptions=True)
    assert fine == "fine" and isinstance(failure, JobFailedError) and failure.job_id == ids[1]


def test_as_completed_yields_each_outcome_as_it_finishes(queue: Queue) -> None:
    def fail() -> None:
        raise RuntimeError("no")

    ok = queue.task(name="ok")(lambda n: n)
    bad = queue.task(name="bad", max_attempts=1)(fail)
    later = queue.task(name="later")(lambda: None)
    done = [ok.enqueue(1), bad.enqueue()]
    drain(queue)
    seen = {o.job_id: o for o in queue.as_completed(done, timeout=60)}
    assert seen[done[0]].get() == 1 and seen[done[0]].status is JobStatus.SUCCEEDED
    assert seen[done[1]].status is JobStatus.FAILED
    with pytest.raises(JobFailedError):
        seen[done[1]].get()
    pending = later.with_options(delay=HOUR).enqueue()
    finished: list[int] = []
    with pytest.raises(WaitTimeoutError) as caught:
        for outcome in queue.as_completed([done[0], pending], timeout=0.3):
            finished.append(outcome.job_id)
    assert finished == [done[0]] and caught.value.job_ids == [pending]


def test_async_as_completed_and_wait_many(dsn: str, schema: str) -> None:
    async def scenario() -> None:
        queue = AsyncQueue(dsn, schema=schema)
        echo = queue.task(name="echo")(lambda v: v)
        ids = [await echo.enqueue(v) for v in (1, 2, 3)]
        waiting = asyncio.ensure_future(queue.wait_many(ids, timeout=60))
        await adrain(queue)
        assert await waiting == [1, 2, 3]
        got = {o.job_id: o.result async for o in queue.as_completed(ids, timeout=60)}
        assert got == dict(zip(ids, [1, 2, 3], strict=True))
        await queue.close()

    asyncio.run(scenario())


def test_waiter_rows_go_when_waits_end_and_dead_sessions_are_swept(
    queue: Queue, dsn: str, schema: str
) -> None:
    task = queue.task(name="t")(lambda: None)
    # A session that registered and died: its row stays until a waiter sweeps it.
    orphan = task.with_options(delay=HOUR).enqueue()
    with psycopg.connect(dsn, autocommit=True) as dead:
        dead.execute(query("wait_register", schema), {"ids": [orphan]})
    assert _rows(dsn, schema) == 1
    with pytest.raises(WaitTimeoutError):
        queue.wait(task.with_options(delay=HOUR).enqueue(), timeout=0.3)
    quick = task.enqueue()
    drain(queue)
    queue.wait(quick, timeout=60)  # its step ends the timed-out wait's row first
    # The wait returns as its own row's delete commits (waiting.py): the orphan's, the
    # timed-out wait's and the quick one's rows all go.
    wait_until(lambda: _rows(dsn, schema) == 0, timeout=10, what="every waiter row to go")
    with pytest.raises(WaitTimeoutError):
        queue.wait(orphan, timeout=0.3)
    queue.close()  # the timed-out wait's row goes with the queue's close
    assert _rows(dsn, schema) == 0


def test_bad_input_gives_clear_errors(queue: Queue, dsn: str, schema: str) -> None:
    task = queue.task(name="t")(lambda: None)
    job_id = task.enqueue()
    with pytest.raises(ConfigurationError, match="greater than 0"):
        queue.wait(job_id, timeout=-1)
    with pytest.raises(ConfigurationError, match="greater than 0"):
        queue.wait(job_id, timeout=0)
    with pytest.raises(ConfigurationError, match="job ids"):
        queue.wait("7", timeout=1)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="job ids"):
        queue.wait_many([job_id, -3], timeout=1)
    with pytest.raises(JobNotFoundError, match="123456789"):
        queue.wait(123456789, timeout=10)
    with pytest.raises(ConfigurationError, match="poll_interval"):
        WaitSettings(poll_interval=0)
    forgetful = Queue(dsn, schema=schema, keep_history=False)
    with pytest.raises(ConfigurationError, match="keep_history=False"):
        forgetful.wait(job_id, timeout=1)


def test_a_schema_never_migrated_is_a_clear_error(dsn: str) -> None:
    queue = Queue(dsn, schema="pgq_never_migrated")
    try:
        with pytest.raises(Exception, match="migrate") as caught:
            queue.wait(1, timeout=10)
        assert isinstance(caught.value, __import__("pgqueue").DatabaseError)
    finally:
        queue.close()


def test_a_finish_that_raced_the_registration_is_found_without_waiting_for_a_poll(
    queue: Queue, dsn: str, schema: str
) -> None:
    """A finish that looked for waiters before the wait registered, and committed after the
    wait's first read, sent no notice: the wait reads the job again soon after registering."""
    echo = queue.task(name="echo")(lambda value: value)
    _only_notices(queue)
    job_id = echo.enqueue("late")
    ended: list[BaseException] = []

    def waiting() -> None:
        try:
            queue.wait(job_id, timeout=60)
        except BaseException as exc:  # the test reads what ended the wait
            ended.append(exc)

    last_read = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue:wait'"
        " AND datname = current_database() AND state = 'idle' AND query LIKE %s"
    )
    with psycopg.connect(dsn) as finisher, psycopg.connect(dsn, autocommit=True) as watch:
        queue.cancel_job(job_id, conn=finisher)  # looks for waiters now: there are none
        thread = threading.Thread(target=waiting)
        thread.start()
        wait_until(lambda: _rows(dsn, schema) == 1, what="the wait's registration")
        wait_until(
            lambda: watch.execute(last_read, ("%gone AS MATERIALIZED%",)).fetchone() == (1,),
            what="the wait's read of a job still live to it",
        )
        assert thread.is_alive()
    # The cancellation commits here, with no notice: an hour's poll would be too late.
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], JobCancelledError)


def test_wait_workflow_returns_once_every_job_has_ended(queue: Queue) -> None:
    add = queue.task(name="add")(lambda a, b: a + b)
    double = queue.task(name="double")(lambda n: n * 2)
    flow = queue.enqueue_workflow(chain(add.job(2, 3), double.s(), double.s()))
    _only_notices(queue)
    with working(queue):
        ended = queue.wait_workflow(flow, timeout=60)
    assert ended.id == flow.id and ended.finished and ended.succeeded
    assert [job.id for job in ended.jobs] == flow.job_ids
    assert queue.wait(flow.job_ids[-1], timeout=10) == 20
    # By id, once finished, it is read back at once; so is the record itself.
    assert queue.wait_workflow(flow.id, timeout=10).succeeded
    assert queue.wait_workflow(ended, timeout=10).counts == {"succeeded": 3}


def test_wait_workflow_covers_a_failure_and_the_cancellations_it_caused(queue: Queue) -> None:
    def explode() -> None:
        raise ValueError("no")

    boom = queue.task(name="boom", max_attempts=1)(explode)
    after = queue.task(name="after")(lambda: None)
    flow = queue.enqueue_workflow(chain(boom.job(), after.job(), after.job()))
    _only_notices(queue)
    with working(queue):
        ended = queue.wait_workflow(flow.id, timeout=60)
    assert ended.finished and not ended.succeeded
    assert [job.status for job in ended.jobs] == [
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
    ]


def test_wait_workflow_times_out_naming_the_jobs_left_and_checks_its_input(
    queue: Queue,
) -> None:
    t = queue.task(name="t")(lambda: None)
    flow = queue.enqueue_workflow(chain(t.job(), t.job()), after=())
    with pytest.raises(WaitTimeoutError) as caught:
        queue.wait_workflow(flow, timeout=0.3)
    assert caught.value.job_ids == flow.job_ids
    with pytest.raises(JobNotFoundError, match="workflow with id 987654321"):
        queue.wait_workflow(987654321, timeout=1)
    with pytest.raises(ConfigurationError, match="workflow's id"):
        queue.wait_workflow("7", timeout=1)  # type: ignore[arg-type]


def test_async_wait_workflow(dsn: str, schema: str) -> None:
    async def scenario() -> None:
        queue = AsyncQueue(dsn, schema=schema)
        echo = queue.task(name="echo")(lambda v: v)
        flow = await queue.enqueue_workflow(group(echo.job(1), echo.job(2)))
        waiting = asyncio.ensure_future(queue.wait_workflow(flow.id, timeout=60))
        await adrain(queue)
        ended = await waiting
        assert ended.succeeded and [job.id for job in ended.jobs] == flow.job_ids
        await queue.close()

    asyncio.run(scenario())
