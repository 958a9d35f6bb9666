"""{schema}.enqueue(...) gives a job its task's declared options once the declaration is
synced (a worker's start, Queue.sync_tasks): the call's options first, then the task's, then
the defaults of a task nobody declared."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import AsyncQueue, Queue, RetryPolicy
from pgqueue.models import Job
from pgqueue.worker.worker import Worker
from tests.conftest import wait_until, worker_in_thread

# Run on each server CI tests against: enqueue from SQL runs the server's functions.
pytestmark = pytest.mark.each_server


def _enqueue(conn: psycopg.Connection[Any], schema: str, call: str, *params: object) -> int:
    row = conn.execute(
        sql.SQL("SELECT {}.enqueue(" + call + ")").format(sql.Identifier(schema)), params
    ).fetchone()
    assert row is not None
    return int(row[0])


def _job(queue: Queue, job_id: int) -> Job:
    job = queue.get_job(job_id)
    assert job is not None
    return job


def _declare_receipt(app: Queue, **options: Any) -> None:
    @app.task(name="shop.send_receipt", **options)
    def send_receipt(order_id: int) -> None:
        raise RuntimeError(f"mail server down for order {order_id}")


def test_a_trigger_job_gets_its_tasks_declared_queue_and_attempts_and_runs_on_its_worker(
    queue: Queue, dsn: str, schema: str
) -> None:
    _declare_receipt(queue, queue="mail", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    s = sql.Identifier(schema)
    worker = Worker(queue, dsn=dsn, queues=["mail"], poll_interval=0.2)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        # The worker writes its declarations before it registers.
        wait_until(lambda: worker.id != 0, what="the worker's start")
        conn.execute(sql.SQL("CREATE TABLE {}.orders (id int PRIMARY KEY)").format(s))
        conn.execute(
            sql.SQL(
                """
                CREATE FUNCTION {s}.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM {s}.enqueue('shop.send_receipt',
                                        jsonb_build_object('order_id', NEW.id));
                    RETURN NEW;
                END $$
                """
            ).format(s=s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER placed AFTER INSERT ON {s}.orders"
                " FOR EACH ROW EXECUTE FUNCTION {s}.order_placed()"
            ).format(s=s)
        )
        conn.execute(sql.SQL("INSERT INTO {}.orders VALUES (7)").format(s))
        conn.commit()
        [job_id] = [j.id for j in queue.list_jobs(task="shop.send_receipt").jobs]
        wait_until(lambda: _job(queue, job_id).status == "failed", what="the job's last attempt")
    job = _job(queue, job_id)
    assert (job.queue, job.max_attempts, job.attempt) == ("mail", 2, 2)
    assert "order 7" in (job.last_error or "")


def test_options_given_in_the_call_win_over_the_declared_ones(
    queue: Queue, dsn: str, schema: str
) -> None:
    _declare_receipt(queue, queue="mail", max_attempts=2, priority=5, tags=["shop"])
    queue.sync_tasks()
    with psycopg.connect(dsn, autocommit=True) as conn:
        declared = _enqueue(conn, schema, "'shop.send_receipt', %s::jsonb", '{"order_id": 1}')
        given = _enqueue(
            conn,
            schema,
            "'shop.send_receipt', %s::jsonb, queue => 'urgent', max_attempts => 9,"
            " priority => -3, tags => ARRAY['vip']",
            '{"order_id": 2}',
        )
        # NULL means "not given", so enqueue_many's missing keys take the task's too.
        [many] = conn.execute(
            sql.SQL("SELECT * FROM {}.enqueue_many(%s::jsonb)").format(sql.Identifier(schema)),
            ['[{"task": "shop.send_receipt", "args": {"order_id": 3}, "priority": 1}]'],
        ).fetchall()
    got = {
        job_id: (j.queue, j.max_attempts, j.priority, j.tags)
        for job_id in (declared, given, many[0])
        for j in [_job(queue, job_id)]
    }
    assert got == {
        declared: ("mail", 2, 5, ["shop"]),
        given: ("urgent", 9, -3, ["vip"]),
        many[0]: ("mail", 2, 1, ["shop"]),
    }


def test_an_undeclared_task_gets_the_sql_defaults(queue: Queue, dsn: str, schema: str) -> None:
    _declare_receipt(queue, queue="mail", max_attempts=2)
    queue.sync_tasks()
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = _enqueue(conn, schema, "'shop.refund', %s::jsonb", '{"order_id": 1}')
    job = _job(queue, job_id)
    assert (job.queue, job.max_attempts, job.priority, job.tags) == ("default", 25, 0, [])
    assert job.status == "queued"


def test_a_changed_declaration_reaches_sql_when_synced_again(
    queue: Queue, dsn: str, schema: str
) -> None:
    _declare_receipt(queue, queue="mail", max_attempts=2)
    assert queue.sync_tasks() == ["shop.send_receipt"]
    assert queue.sync_tasks() == []  # unchanged: not rewritten
    redeployed = Queue(dsn, schema=schema)
    _declare_receipt(redeployed, queue="mail-eu", max_attempts=4)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            before = _enqueue(conn, schema, "'shop.send_receipt', %s::jsonb", '{"order_id": 1}')
            assert redeployed.sync_tasks() == ["shop.send_receipt"]
            after = _enqueue(conn, schema, "'shop.send_receipt', %s::jsonb", '{"order_id": 2}')
    finally:
        redeployed.close()
    assert (_job(queue, before).queue, _job(queue, before).max_attempts) == ("mail", 2)
    assert (_job(queue, after).queue, _job(queue, after).max_attempts) == ("mail-eu", 4)


def test_a_declared_delay_keys_and_atomic_flag_reach_the_job(
    queue: Queue, dsn: str, schema: str
) -> None:
    @queue.task(
        name="report",
        delay=timedelta(hours=1),
        limits=["tenant:{tenant}", "size:{size}:{urgent}:{{x}}", "reports"],
    )
    def report(tenant: str, size: int = 0, urgent: bool = False) -> None: ...

    @queue.task(name="ledger", atomic=True)
    def ledger(entry: int) -> None: ...

    @queue.task(name="throttled", concurrency_key="api")
    def throttled() -> None: ...

    queue.sync_tasks()
    with psycopg.connect(dsn, autocommit=True) as conn:
        scheduled = _enqueue(
            conn, schema, "'report', %s::jsonb", '{"tenant": "acme", "size": 3, "urgent": true}'
        )
        now = _enqueue(
            conn,
            schema,
            "'report', %s::jsonb, run_at => now()",
            '{"tenant": "acme", "size": 0, "urgent": false}',
        )
        atomic = _enqueue(conn, schema, "'ledger', %s::jsonb", '{"entry": 1}')
        keyed = _enqueue(conn, schema, "'throttled'")
        rows = conn.execute(
            sql.SQL(
                "SELECT id, status, limit_keys, atomic, concurrency_key FROM {}.jobs ORDER BY id"
            ).format(sql.Identifier(schema))
        ).fetchall()
    keys = ["tenant:acme", "size:3:True:{x}", "reports"]
    assert rows == [
        (scheduled, "scheduled", keys, False, None),
        (now, "queued", ["tenant:acme", "size:0:False:{x}", "reports"], False, None),
        (atomic, "queued", None, True, None),
        (keyed, "queued", None, False, "api"),
    ]
    # The keys the client formats from the same arguments.
    assert report.job(tenant="acme", size=3, urgent=True).options.limits == tuple(keys)


@pytest.mark.parametrize(
    ("call", "args", "says"),
    [
        ("'report', %s::jsonb", '{"size": 3}', "needs the argument \\{tenant\\}"),
        ("'report', %s::jsonb", '{"tenant": 1.5}', "formats \\{tenant\\} from 1.5"),
        ("'ledger', %s::jsonb, concurrency_key => 'k'", "{}", "atomic"),
    ],
)
def test_a_job_its_declaration_cannot_be_applied_to_is_refused(
    queue: Queue, dsn: str, schema: str, call: str, args: str, says: str
) -> None:
    @queue.task(name="report", limits=["tenant:{tenant}"])
    def report(tenant: Any = None, size: int = 0) -> None: ...

    @queue.task(name="ledger", atomic=True)
    def ledger() -> None: ...

    queue.sync_tasks()
    with (
        psycopg.connect(dsn) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue, match=says),
    ):
        _enqueue(conn, schema, call, args)


def test_the_async_queue_syncs_its_declarations_too(queue: Queue, dsn: str, schema: str) -> None:
    app = AsyncQueue(dsn, schema=schema)

    @app.task(name="shop.send_receipt", queue="mail", max_attempts=2)
    async def send_receipt(order_id: int) -> None: ...

    async def sync() -> list[str]:
        try:
            return await app.sync_tasks()
        finally:
            await app.close()

    assert asyncio.run(sync()) == ["shop.send_receipt"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = _enqueue(conn, schema, "'shop.send_receipt', %s::jsonb", '{"order_id": 1}')
    assert (_job(queue, job_id).queue, _job(queue, job_id).max_attempts) == ("mail", 2)
