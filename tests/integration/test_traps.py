"""Inputs that used to be accepted or ignored without a word, and mistakes that used to leak a
raw driver error: each now meets a pgqueue error that names the limit or says what to do, and
nothing is stored."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from pgqueue import (
    AsyncQueue,
    ConfigurationError,
    ConnectionLostError,
    DatabaseError,
    JobStatus,
    Queue,
    RetryPolicy,
    WorkerSettings,
)
from tests.conftest import count


def _noop_task(queue: Queue, **options: Any) -> Any:
    @queue.task(name="noop", **options)
    def noop() -> None: ...

    return noop


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"delay": 1e12}, "delay must be at most 3650 days"),
        ({"delay": timedelta.max}, "delay must be at most 3650 days"),
        ({"delay": 1e300}, "delay"),  # no timedelta can hold it
        ({"run_at": datetime(9999, 1, 1, tzinfo=timezone.utc)}, "run_at must be at most 3650"),
        ({"dedupe_key": "k", "dedupe_window": 1e12}, "dedupe_window must be at most 3650"),
        ({"delay": 5, "run_at": datetime.now(timezone.utc)}, "not both"),
        ({"dedupe_window": 60}, "dedupe_window applies to jobs enqueued with a dedupe_key"),
    ],
    ids=[
        "delay-huge",
        "delay-max",
        "delay-overflow",
        "run-at-far",
        "window-huge",
        "both",
        "window",
    ],
)
def test_job_times_out_of_range_are_refused_naming_the_limit(
    queue: Queue, conn: psycopg.Connection[Any], schema: str, options: dict[str, Any], text: str
) -> None:
    noop = _noop_task(queue)
    with pytest.raises(ConfigurationError, match=text):
        noop.with_options(**options).enqueue()
    with pytest.raises(ConfigurationError, match=text):
        queue.enqueue(noop.job(), conn=conn, **options)
    conn.rollback()
    assert count(conn, schema, "jobs") == 0


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"timeout": 1e9}, "timeout must be at most 3650 days"),
        ({"timeout": 1e300}, r"timeout=1e\+300 seconds is out of range"),
        ({"delay": float("nan")}, "delay=nan seconds is out of range"),
        ({"dedupe_window": 1e12}, "dedupe_window must be at most 3650 days"),
        ({"retry": "later"}, "retry"),
        ({"name": ""}, "invalid task name ''"),
    ],
)
def test_task_options_out_of_range_are_refused(
    queue: Queue, options: dict[str, Any], text: str
) -> None:
    with pytest.raises(ConfigurationError, match=text):
        queue.task(**({"name": "t"} | options))(_handler)


def _handler() -> None: ...


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"base": timedelta(days=10**6)}, "base must be at most 3650 days"),
        ({"cap": 1e12}, "cap must be at most 3650 days"),
        ({"base": -1}, "base must be 0 seconds or more"),
    ],
)
def test_retry_policies_out_of_range_are_refused(fields: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigurationError, match=text):
        RetryPolicy(**fields)


def test_the_longest_retry_policy_computes_every_delay_without_overflow() -> None:
    policy = RetryPolicy(base=timedelta(days=3650), cap=timedelta(days=3650), jitter=0)
    assert {policy.delay(attempt) for attempt in (1, 40, 1000)} == {timedelta(days=3650)}


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"poll_interval": 1e12}, "poll_interval must be at most 3600 seconds"),
        ({"lease_timeout": 1e10}, "lease_timeout must be at most 1 days"),
        ({"shutdown_grace": 1e7}, "shutdown_grace must be at most 1 days"),
        ({"rescue_interval": 0}, "rescue_interval must be greater than 0 seconds"),
    ],
)
def test_worker_intervals_out_of_range_are_refused(fields: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigurationError, match=text):
        WorkerSettings(**fields)


def test_a_time_given_at_enqueue_replaces_the_tasks_default(
    queue: Queue, conn: psycopg.Connection[Any]
) -> None:
    noop = _noop_task(queue, delay=3600)
    soon = datetime.now(timezone.utc) + timedelta(seconds=30)
    job_id = queue.enqueue(noop.job(), conn=conn, run_at=soon)
    conn.commit()
    job = queue.get_job(job_id, conn=conn)
    assert job is not None and job.run_at == soon and job.status == JobStatus.SCHEDULED


def test_a_task_level_dedupe_window_applies_to_keys_given_later(
    queue: Queue, conn: psycopg.Connection[Any]
) -> None:
    noop = _noop_task(queue, dedupe_window=60)
    first = queue.enqueue(noop.job(), conn=conn, dedupe_key="k")
    again = queue.enqueue(noop.job(), conn=conn, dedupe_key="k")
    assert first == again and not again.created


@pytest.mark.parametrize("job_id", ["abc", 2**63, 0, -1, True, 1.5])
def test_a_job_id_that_cannot_exist_is_a_clear_error(queue: Queue, job_id: Any) -> None:
    for call in (queue.get_job, queue.cancel_job, queue.retry_job):
        with pytest.raises(ConfigurationError, match="job ids are whole numbers"):
            call(job_id)


def test_enqueue_on_a_closed_connection_or_aborted_transaction_is_a_pgqueue_error(
    dsn: str, queue: Queue, schema: str
) -> None:
    noop = _noop_task(queue)
    closed = psycopg.connect(dsn)
    closed.close()
    with pytest.raises(DatabaseError, match="is closed"):
        queue.enqueue(noop.job(), conn=closed)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
        with pytest.raises(DatabaseError, match="roll it back"):
            queue.enqueue(noop.job(), conn=conn)
        conn.rollback()
        assert count(conn, schema, "jobs") == 0


def test_a_connection_lost_mid_call_is_a_pgqueue_error_with_the_cause(
    dsn: str, queue: Queue
) -> None:
    noop = _noop_task(queue)
    with psycopg.connect(dsn) as conn, psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [conn.info.backend_pid])
        with pytest.raises(ConnectionLostError) as caught:
            queue.enqueue(noop.job(), conn=conn)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)
    # Still what a retry loop written against psycopg catches, and still a pgqueue error.
    assert isinstance(caught.value, psycopg.OperationalError)
    assert isinstance(caught.value, DatabaseError)


def test_enqueue_before_migrate_says_to_migrate_that_schema(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    schema = f"pgq_unmigrated_{uuid.uuid4().hex[:8]}"
    queue = Queue(dsn, schema=schema)
    noop = _noop_task(queue)
    with pytest.raises(DatabaseError, match=f"run `pgqueue migrate --schema {schema}`") as caught:
        queue.enqueue(noop.job(), conn=conn)
    missing = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)
    assert isinstance(caught.value.__cause__, missing)
    with pytest.raises(DatabaseError, match="pgqueue migrate"):
        noop.enqueue()  # the queue's own pooled connection says the same
    queue.close()


def test_the_async_twin_refuses_the_same_connections(dsn: str, schema: str) -> None:
    queue = AsyncQueue(dsn, schema=schema)

    @queue.task(name="anoop")
    async def anoop() -> None: ...

    async def main() -> None:
        closed = await psycopg.AsyncConnection.connect(dsn)
        await closed.close()
        with pytest.raises(DatabaseError, match="is closed"):
            await queue.enqueue(anoop.job(), conn=closed)
        with pytest.raises(ConfigurationError, match="job ids"):
            await queue.get_job("abc")  # type: ignore[arg-type]
        await queue.close()

    asyncio.run(main())


def test_a_worker_refuses_a_schema_missing_this_versions_migrations(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    """Upgrading pgqueue without `pgqueue migrate`: the worker says which migrations are
    missing at start, instead of failing at its first claim."""

    from pgqueue.testing import drain

    conn.execute(f'DELETE FROM "{schema}".migrations WHERE version = 9')
    conn.execute(f'DROP TABLE "{schema}".queue_pauses')
    conn.commit()
    queue = Queue(dsn, schema=schema)
    with pytest.raises(DatabaseError, match=r"lacks migrations 0009_queue_pause .*pgqueue migrate"):
        drain(queue, dsn=dsn)
