"""Enqueue on the caller's connection: visibility follows the caller's transaction."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from pgqueue import (
    AsyncQueue,
    ConfigurationError,
    DatabaseError,
    InvalidArgumentsError,
    Queue,
    UnknownTaskError,
)
from pgqueue.bulk import COPY_MIN_JOBS
from pgqueue.queries import migrations, query
from pgqueue.testing import drain, enqueued_jobs
from tests.conftest import claim_params, count, drop_schema, listen_for_wakes


def _claim_one(dsn: str, schema: str) -> list[Any]:
    """Claim from a second connection, as a worker would."""
    with psycopg.connect(dsn, autocommit=True) as other:
        params = claim_params(worker_id=999)
        return other.execute(query("job_claim", schema), params).fetchall()


def test_enqueue_rolled_back_job_never_runs(queue: Queue, dsn: str, schema: str) -> None:
    ran: list[int] = []

    @queue.task(name="t")
    def t(i: int) -> None:
        ran.append(i)

    with psycopg.connect(dsn) as conn:
        queue.enqueue(t.job(1), conn=conn)
        conn.rollback()
        queue.enqueue(t.job(2), conn=conn)
        conn.commit()
    drain(queue, concurrency=4)
    assert ran == [2]
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 0
        assert count(conn, schema, "job_history") == 1


def test_enqueue_in_open_transaction_is_invisible_until_commit(
    queue: Queue, dsn: str, schema: str
) -> None:
    t = queue.task(name="t")(lambda: None)
    with psycopg.connect(dsn) as conn:
        job_id = queue.enqueue(t.job(), conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert _claim_one(dsn, schema) == []
        conn.commit()
    claimed = _claim_one(dsn, schema)
    assert [row[0] for row in claimed] == [job_id]


def test_enqueue_leaves_the_callers_transaction_open_and_uncommitted(
    queue: Queue, conn: psycopg.Connection[Any], schema: str
) -> None:
    t = queue.task(name="t")(lambda x: None)
    conn.execute("CREATE TEMP TABLE mine (x int)")
    conn.execute("INSERT INTO mine VALUES (1)")
    queue.enqueue(t.job(1), conn=conn)
    queue.enqueue_many([t.job(2), t.job(3)], conn=conn)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert len(enqueued_jobs(conn, queue)) == 3
    conn.rollback()
    assert enqueued_jobs(conn, queue) == []


def test_enqueue_without_connection_commits_on_its_own(queue: Queue, dsn: str) -> None:
    @queue.task(name="t")
    def t(x: int) -> None: ...

    job_id = t.enqueue(5)
    with psycopg.connect(dsn) as other:
        (job,) = enqueued_jobs(other, queue)
    assert job.id == job_id and job.args == {"x": 5} and job.status == "queued"


def test_enqueue_many_returns_ids_in_order_in_one_statement(
    queue: Queue, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = queue.task(name="t")(lambda i: None)
    executed: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: psycopg.Cursor[Any], *args: Any, **kwargs: Any) -> Any:
        executed.append("x")
        return execute(self, *args, **kwargs)

    # pgqueue runs its statements on psycopg's own cursor, whatever the connection's factory.
    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    n = COPY_MIN_JOBS - 1  # from COPY_MIN_JOBS on, a batch takes COPY (test_bulk.py)
    ids = queue.enqueue_many([t.job(i) for i in range(n)], conn=conn)
    conn.commit()
    assert len(executed) == 1
    assert ids == sorted(ids) and len(set(ids)) == n
    jobs = enqueued_jobs(conn, queue)
    assert [j.args["i"] for j in jobs] == list(range(n))


def test_an_enqueue_alone_wakes_with_its_own_position_and_a_scheduled_one_does_not(
    queue: Queue, dsn: str
) -> None:
    t = queue.task(name="t")(lambda i: None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema, ("q", "default"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            now = queue.enqueue(t.job(1), conn=conn, queue="q", priority=-5)
            queue.enqueue(t.job(2), conn=conn, queue="q", delay=3600)
        pooled = queue.enqueue(t.job(3))
        payloads = [n.payload for n in listener.notifies(timeout=1.0)]
    assert payloads == [f"q -5 {now}", f"default 0 {pooled}"]


def test_enqueue_sends_one_notification_per_transaction_per_queue(queue: Queue, dsn: str) -> None:
    t = queue.task(name="t")(lambda i: None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema, ("default", "other", "third"))
        with psycopg.connect(dsn) as conn:
            for i in range(20):
                queue.enqueue(t.job(i), conn=conn)
                queue.enqueue(t.job(i), conn=conn, queue="other")
            queue.enqueue_many([t.job(i) for i in range(50)], conn=conn)
            first = queue.enqueue(t.job(0), conn=conn, queue="third")
            urgent = queue.enqueue(t.job(1), conn=conn, queue="third", priority=-1)
            conn.commit()
        notes = list(listener.notifies(timeout=0.5))
    payloads = sorted(n.payload for n in notes)
    # Each names the lowest (priority, id) the transaction made claimable in its queue; a
    # later statement that goes lower (more urgent) sends one more.
    assert [p.split()[0] for p in payloads] == ["default", "other", "third", "third"]
    assert f"third 0 {first}" in payloads and f"third -1 {urgent}" in payloads


def test_a_connection_that_makes_client_side_cursors_still_prepares_where_it_may(
    queue: Queue, dsn: str
) -> None:
    # Django's connection makes client-side binding cursors and, by default, prepares nothing.
    t = queue.task(name="t")(lambda i: None)
    prepared = "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%insert_job%'"
    for threshold, expected in ((0, 1), (None, 0)):
        with psycopg.connect(
            dsn, cursor_factory=psycopg.ClientCursor, prepare_threshold=threshold
        ) as conn:
            ids = [queue.enqueue(t.job(i), conn=conn) for i in range(3)]
            conn.commit()
            assert conn.execute(prepared).fetchone() == (expected,), threshold
            assert [j.id for j in enqueued_jobs(conn, queue)][-3:] == ids


def test_enqueue_options_are_stored(queue: Queue, conn: psycopg.Connection[Any]) -> None:
    @queue.task(name="t", queue="mail", priority=5, max_attempts=3)
    def t(x: int) -> None: ...

    queue.enqueue(t.job(1), conn=conn)
    queue.enqueue(t.job(2), conn=conn, priority=-3, max_attempts=7, queue="urgent")
    queue.enqueue(t.job(3), conn=conn, delay=3600)
    first, second, third = enqueued_jobs(conn, queue)
    assert (first.queue, first.priority, first.max_attempts) == ("mail", 5, 3)
    assert (second.queue, second.priority, second.max_attempts) == ("urgent", -3, 7)
    assert third.status == "scheduled" and first.status == "queued"


def test_enqueue_unregistered_task_name_raises_and_stores_nothing(
    queue: Queue, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(UnknownTaskError, match="no_such_task"):
        queue.enqueue("no_such_task", {"x": 1}, conn=conn)
    assert enqueued_jobs(conn, queue) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"x": "not a number"}, "invalid arguments"),
        ({"y": 1}, "missing a required argument|unexpected keyword"),
        ({"x": 1, "note": "nul \x00 inside"}, "NUL character"),
        ({"x": 1, "note": object()}, "not JSON"),
    ],
)
def test_enqueue_bad_arguments_raise_clear_error_and_store_nothing(
    queue: Queue, conn: psycopg.Connection[Any], args: dict[str, Any], message: str
) -> None:
    @queue.task(name="t")
    def t(x: int, note: Any = None) -> None: ...

    with pytest.raises(InvalidArgumentsError, match=message):
        queue.enqueue("t", args, conn=conn)
    with pytest.raises(InvalidArgumentsError):
        queue.enqueue_many([t.job(1), t.job(**args)], conn=conn)
    assert enqueued_jobs(conn, queue) == []


def test_task_called_directly_runs_now_as_a_plain_function(queue: Queue) -> None:
    @queue.task
    def add(a: int, b: int) -> int:
        return a + b

    assert add(2, 3) == 5
    assert add.name.endswith("add")


def test_async_queue_enqueues_on_the_callers_async_connection(dsn: str, schema: str) -> None:
    aqueue = AsyncQueue(dsn, schema=schema)

    @aqueue.task(name="t")
    async def t(x: int) -> int:
        return x

    async def scenario() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn:
            kept = await aqueue.enqueue(t.job(1), conn=aconn)
            await aconn.commit()
            await aqueue.enqueue(t.job(2), conn=aconn)
            await aconn.rollback()
        pooled = await t.enqueue(3)
        await aqueue.close()
        return kept, pooled

    kept, pooled = asyncio.run(scenario())
    with psycopg.connect(dsn) as conn:
        assert [j.id for j in enqueued_jobs(conn, aqueue)] == [kept, pooled]


@pytest.mark.parametrize(
    ("bad_dsn", "error", "message"),
    [
        ("host=127.0.0.1 port=1 user=nobody password=s3cret", DatabaseError, "cannot connect"),
        ("this is not = a dsn ==", ConfigurationError, "invalid DSN"),
    ],
)
def test_pooled_enqueue_with_a_bad_dsn_raises_a_clear_error_at_once(
    bad_dsn: str, error: type[Exception], message: str
) -> None:
    queue = Queue(bad_dsn)
    t = queue.task(name="t")(lambda: None)
    with pytest.raises(error, match=message) as caught:
        t.enqueue()
    assert "s3cret" not in str(caught.value)


def test_a_task_defined_in_another_service_is_enqueued_by_name_and_run_there(
    dsn: str, schema: str
) -> None:
    """The caller declares the name only; the service that defines the function runs it."""
    caller, service = Queue(dsn, schema=schema), Queue(dsn, schema=schema)
    charge = caller.declare("billing.charge", queue="billing")
    ran: list[tuple[int, str]] = []

    @service.task(name="billing.charge", queue="billing")
    def real_charge(customer: int, amount: str) -> str:
        ran.append((customer, amount))
        return "charged"

    by_name = caller.enqueue("billing.charge", {"customer": 7, "amount": "12.50"})
    by_handle = charge.enqueue(customer=8, amount="1.00")
    assert real_charge(9, "0.10") == "charged"  # a plain call runs it now
    assert ran == [(9, "0.10")]
    drain(service, queues=["billing"])
    assert sorted(ran) == [(7, "12.50"), (8, "1.00"), (9, "0.10")]
    for job_id in (by_name, by_handle):
        assert service.get_job(job_id).result == "charged"  # type: ignore[union-attr]
    caller.close()
    service.close()


def test_async_task_enqueue_and_call_read_like_the_sync_ones(dsn: str, schema: str) -> None:
    async def main() -> None:
        queue = AsyncQueue(dsn, schema=schema)

        @queue.task(name="double")
        async def double(x: int) -> int:
            return 2 * x

        assert await double(4) == 8  # runs now
        job_id = await double.enqueue(5)  # queued
        assert job_id.created
        job = await queue.get_job(job_id)
        assert job is not None and job.status == "queued" and job.args == {"x": 5}
        await queue.close()

    asyncio.run(main())


def test_async_queue_migrates_a_schema_once(dsn: str) -> None:
    """AsyncQueue.migrate applies every migration, then finds nothing to do."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"

    async def migrate_twice() -> tuple[list[str], list[str]]:
        queue = AsyncQueue(dsn, schema=name)
        try:
            return await queue.migrate(), await queue.migrate()
        finally:
            await queue.close()

    try:
        first, second = asyncio.run(migrate_twice())
    finally:
        drop_schema(dsn, name)
    assert first == [f"{m.version:04d}_{m.name}" for m in migrations()]
    assert second == []
