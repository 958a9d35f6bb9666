"""Bulk enqueue through COPY (pgqueue/bulk.py): the same rows, ids and wake-ups as job_insert."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import AsyncQueue, InvalidArgumentsError, Queue
from pgqueue.bulk import COPY_MIN_JOBS
from pgqueue.models import JobOptions, NewJob
from pgqueue.testing import drain
from tests.conftest import count, listen_for_wakes

# Run on each server CI tests against: bulk enqueue takes the server's COPY.
pytestmark = pytest.mark.each_server

# Characters COPY's text format escapes, its NULL marker as a string, quotes and non-ASCII.
AWKWARD = ["back\\slash", "tab\there", "new\nline", "cr\rhere", "\\N", 'quote"d', "é ü 漢 🎉", ""]

COLUMNS = "queue, task, args, status, priority, attempt, max_attempts, atomic, concurrency_key"


def _rows(conn: psycopg.Connection[Any], schema: str, ids: Sequence[int]) -> list[tuple[Any, ...]]:
    statement = sql.SQL("SELECT {} FROM {}.jobs WHERE id = ANY(%s) ORDER BY id").format(
        sql.SQL(COLUMNS), sql.Identifier(schema)
    )
    return conn.execute(statement, [ids]).fetchall()


def _jobs(queue: Queue) -> list[Any]:
    @queue.task(name="t", max_attempts=3)
    def t(i: int, text: str) -> None:
        return None

    jobs = []
    for i in range(COPY_MIN_JOBS + 36):
        options: dict[str, Any] = {"priority": i % 3 - 1, "queue": ("a", "b")[i % 2]}
        if i % 5 == 0:
            options["concurrency_key"] = AWKWARD[i % len(AWKWARD)] or "plain key"
        jobs.append(t.with_options(**options).job(i, AWKWARD[i % len(AWKWARD)]))
    return jobs


def test_bulk_enqueue_stores_the_rows_job_insert_stores(queue: Queue, dsn: str) -> None:
    jobs = _jobs(queue)
    with psycopg.connect(dsn, autocommit=True) as conn:
        copied = queue.enqueue_many(jobs, conn=conn)
        with conn.transaction():  # in a transaction: job_insert, one statement per job
            folded = [queue.enqueue(job, conn=conn) for job in jobs]
        alone = [queue.enqueue(job, conn=conn) for job in jobs]  # job_insert_one
        assert copied == sorted(copied) and len(set(copied)) == len(jobs)
        assert max(copied) < min(folded)
        by_copy = _rows(conn, queue.schema, copied)
        by_insert = _rows(conn, queue.schema, folded)
        by_insert_one = _rows(conn, queue.schema, alone)
    assert by_copy == by_insert == by_insert_one
    assert [row[2]["i"] for row in by_copy] == list(range(len(jobs)))
    assert by_copy[1][2]["text"] == AWKWARD[1] and by_copy[0][8] == "back\\slash"


def test_bulk_enqueue_wakes_each_queue_once_with_its_lowest_position(
    queue: Queue, dsn: str
) -> None:
    jobs = _jobs(queue)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema, ("a", "b"))
        with psycopg.connect(dsn) as conn:
            ids = queue.enqueue_many(jobs, conn=conn)
            assert list(listener.notifies(timeout=0.2)) == []  # nothing before the commit
            conn.commit()
        payloads = sorted(n.payload for n in listener.notifies(timeout=1.0))
    # Priority -1 falls on i = 0, 3, 6, ...: queue a's first is i = 0, queue b's is i = 3.
    assert payloads == [f"a -1 {ids[0]}", f"b -1 {ids[3]}"]


def test_runs_of_jobs_sharing_options_wake_with_each_queues_lowest_position(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="w", queue="a")
    def w(i: int) -> None:
        return None

    urgent, other = w.with_options(priority=-5), w.with_options(queue="b", priority=2)
    jobs = [w.job(i) for i in range(30)] + [urgent.job(i) for i in range(30, 40)]
    jobs += [w.job(i) for i in range(40, 70)] + [other.job(i) for i in range(70, 80)]
    jobs += [urgent.job(80)]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema, ("a", "b"))
        with psycopg.connect(dsn) as conn:
            ids = queue.enqueue_many(jobs, conn=conn)
            conn.commit()
            rows = _rows(conn, queue.schema, ids)
        payloads = sorted(n.payload for n in listener.notifies(timeout=1.0))
    assert payloads == [f"a -5 {ids[30]}", f"b 2 {ids[70]}"]
    expected = [(j.options.queue, j.options.priority, j.args["i"]) for j in jobs]
    assert [(row[0], row[4], row[2]["i"]) for row in rows] == expected


def test_bulk_enqueue_rolls_back_with_the_callers_transaction(queue: Queue, dsn: str) -> None:
    jobs = _jobs(queue)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema, ("a", "b"))
        with psycopg.connect(dsn) as conn:
            queue.enqueue_many(jobs, conn=conn)
            conn.rollback()
            assert count(conn, queue.schema, "jobs") == 0
        assert list(listener.notifies(timeout=0.5)) == []


def test_bulk_enqueue_refuses_a_bad_job_before_sending_anything(queue: Queue, dsn: str) -> None:
    small = Queue(dsn, schema=queue.schema, max_payload_bytes=1024)
    jobs = _jobs(small)
    jobs[70] = small.registry.get("t").job(70, "x" * 2000)
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        with pytest.raises(InvalidArgumentsError, match=r"job 70 \(t\) has 2,0\d\d bytes"):
            small.enqueue_many(jobs, conn=conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert count(conn, queue.schema, "jobs") == 0
    small.close()


def test_every_insert_path_measures_arguments_alike(queue: Queue, dsn: str) -> None:
    """Arguments of 1,006 bytes as stored (compact JSON), 1,506 with json.dumps' spaces, under
    a limit of 1,024: job_insert_one, job_insert and COPY all take them."""
    small = Queue(dsn, schema=queue.schema, max_payload_bytes=1024)

    @small.task(name="wide")
    def wide(a: list[int]) -> None:
        return None

    job = wide.job([0] * 500)
    with psycopg.connect(dsn, autocommit=True) as conn:
        alone = small.enqueue(job, conn=conn)  # job_insert_one
        with conn.transaction():
            batch = small.enqueue_many([job, job], conn=conn)  # job_insert
        copied = small.enqueue_many([job] * COPY_MIN_JOBS, conn=conn)  # COPY
        assert count(conn, queue.schema, "jobs") == 3 + COPY_MIN_JOBS
    assert alone and len(batch) == 2 and len(copied) == COPY_MIN_JOBS
    small.close()


def test_a_batch_with_a_delayed_job_takes_job_insert(queue: Queue, dsn: str) -> None:
    jobs = _jobs(queue)
    jobs[5] = queue.registry.get("t").with_options(delay=3600).job(5, "later")
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = queue.enqueue_many(jobs, conn=conn)
        statuses = [row[3] for row in _rows(conn, queue.schema, ids)]
    assert statuses.count("scheduled") == 1 and statuses[5] == "scheduled"


def test_a_connection_in_pipeline_mode_takes_job_insert(queue: Queue, dsn: str) -> None:
    """psycopg refuses COPY in pipeline mode: a caller's pipeline gets job_insert's rows."""
    jobs = _jobs(queue)
    with psycopg.connect(dsn) as conn:
        with conn.pipeline():
            piped = queue.enqueue_many(jobs, conn=conn)
        conn.commit()
        copied = queue.enqueue_many(jobs, conn=conn)
        conn.commit()
        assert piped == sorted(piped) and max(piped) < min(copied)
        assert _rows(conn, queue.schema, piped) == _rows(conn, queue.schema, copied)


@pytest.mark.parametrize("piped", [False, True], ids=["autocommit", "caller-pipeline"])
def test_async_bulk_enqueue(dsn: str, schema: str, piped: bool) -> None:
    """On an autocommit connection by COPY; in a caller's pipeline by job_insert."""
    aqueue = AsyncQueue(dsn, schema=schema)

    @aqueue.task(name="t")
    async def t(i: int) -> None:
        return None

    async def main() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=not piped) as conn:
            jobs = [t.job(i) for i in range(200)]
            if not piped:
                return list(await aqueue.enqueue_many(jobs, conn=conn))
            async with conn.pipeline():
                ids = await aqueue.enqueue_many(jobs, conn=conn)
            await conn.commit()
            return list(ids)

    ids = asyncio.run(main())
    assert ids == sorted(ids) and len(set(ids)) == 200
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 200


def test_a_worker_runs_every_bulk_enqueued_job_once(queue: Queue, dsn: str) -> None:
    ran: list[int] = []

    @queue.task(name="r")
    def r(i: int) -> None:
        ran.append(i)

    queue.enqueue_many([r.job(i) for i in range(300)])
    drain(queue, concurrency=20)
    assert sorted(ran) == list(range(300))
    with psycopg.connect(dsn) as conn:
        assert count(conn, queue.schema, "job_history", "status = 'succeeded'") == 300


def test_hand_built_jobs_whose_arguments_are_not_json_are_refused(queue: Queue, dsn: str) -> None:
    good = queue.task(name="t")(lambda i: None).job(1)
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    bad = [NewJob("t", {"x": float("nan")}, JobOptions()), NewJob("t", cyclic, JobOptions())]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job in bad:
            for batch in ([job], [good, job], [good] * COPY_MIN_JOBS + [job]):  # one, many, COPY
                with pytest.raises(InvalidArgumentsError, match="not JSON"):
                    queue.enqueue_many(batch, conn=conn)
        assert count(conn, queue.schema, "jobs") == 0
