"""{schema}.enqueue(...): a job stored from SQL (a trigger, a migration, another language) in
the caller's transaction, with enqueue's checks and its wake-up."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.testing import drain
from tests.apps import tasks as apps
from tests.conftest import count, listen_for_wakes

# Run on each server CI tests against: enqueue from SQL runs the server's functions.
pytestmark = pytest.mark.each_server


def _enqueue(conn: psycopg.Connection[Any], schema: str, call: str, *params: object) -> int:
    row = conn.execute(
        sql.SQL("SELECT {}.enqueue(" + call + ")").format(sql.Identifier(schema)), params
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_job_from_sql_commits_with_the_transaction_and_runs(
    queue: Queue, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        job = _enqueue(conn, schema, "'noop'")
        later = _enqueue(
            conn,
            schema,
            "'sleepy', %s::jsonb, queue => 'default', priority => -5, max_attempts => 3,"
            " tags => ARRAY['from-sql']",
            '{"seconds": 0}',
        )
        scheduled = _enqueue(conn, schema, "'noop', run_at => now() + interval '1 hour'")
        with psycopg.connect(dsn) as other:
            assert count(other, schema, "jobs") == 0  # not before the commit
        conn.commit()
        _enqueue(conn, schema, "'noop'")
        conn.rollback()  # this one is gone
    assert [j.id for j in queue.list_jobs().jobs] == [scheduled, later, job]
    record = queue.get_job(later)
    assert record is not None
    assert (record.priority, record.max_attempts, record.tags) == (-5, 3, ["from-sql"])
    scheduled_job = queue.get_job(scheduled)
    assert scheduled_job is not None and scheduled_job.status == "scheduled"
    drain(apps.queue, dsn=dsn, schema=schema)
    for done in (job, later):
        ran = queue.get_job(done)
        assert ran is not None and ran.status == "succeeded"


def test_arguments_that_do_not_fit_the_task_fail_the_job_with_the_reason(
    queue: Queue, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        job = _enqueue(conn, schema, "'sleepy', %s::jsonb, max_attempts => 1", '{"seconds": "x"}')
        conn.commit()
    drain(apps.queue, dsn=dsn, schema=schema)
    failed = queue.get_job(job)
    assert failed is not None and failed.status == "failed"
    assert "seconds" in (failed.last_error or "")


@pytest.mark.parametrize(
    ("call", "says"),
    [
        ("'has space'", "task name"),
        ("NULL", "task name"),
        ("'noop', queue => '!x'", "queue name"),
        ("'noop', '[1, 2]'", "JSON object"),
        ("'noop', priority => 101", "priority 101"),
        ("'noop', max_attempts => 0", "max_attempts 0"),
        ("'noop', run_at => now() + interval '11 years'", "ten years"),
        ("'noop', run_at => '-infinity'", "ten years"),
        ("'noop', concurrency_key => '*'", "concurrency key"),
        ("'noop', tags => ARRAY['']", "tags"),
        ("'noop', jsonb_build_object('x', repeat('a', 11 * 1024 * 1024))", "byte limit"),
        ("'noop', dedupe_key => ''", "dedupe key"),
        ("'noop', dedupe_key => 'k', dedupe_window => interval '-1 s'", "dedupe_window"),
    ],
)
def test_bad_input_is_refused_with_a_message_and_stores_nothing(
    queue: Queue, dsn: str, schema: str, call: str, says: str
) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
            _enqueue(conn, schema, call)
        conn.rollback()
        assert count(conn, schema, "jobs") == 0


def test_a_trigger_enqueues_a_job_per_row_and_wakes_workers_once(
    queue: Queue, dsn: str, schema: str
) -> None:
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listen_for_wakes(listener, schema, ("orders",))
        conn.execute(sql.SQL("CREATE TABLE {}.orders (id int PRIMARY KEY)").format(s))
        conn.execute(
            sql.SQL(
                """
                CREATE FUNCTION {s}.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM {s}.enqueue('noop', jsonb_build_object(), queue => 'orders');
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
        conn.execute(sql.SQL("INSERT INTO {}.orders SELECT generate_series(1, 50)").format(s))
        conn.commit()
        assert count(conn, schema, "jobs", "queue = 'orders'") == 50
        notices = [n.payload for n in listener.notifies(timeout=1.0)]
    first = min(j.id for j in queue.list_jobs(queue="orders").jobs)
    assert notices == [f"orders 0 {first}"]


@pytest.mark.parametrize("row", ["steady", "control-busy", "control-waiting"])
def test_a_job_from_sql_is_announced_as_a_new_one(
    queue: Queue, dsn: str, schema: str, row: str
) -> None:
    # A worker keeping up with a stream of jobs (its row new_only) finds new jobs with the
    # claims it makes anyway and skips their wake-ups, as the client's enqueues know; a job
    # from SQL is new too. Controls: a busy worker's row skips it as well, a waiting one's
    # (a range that skips nothing) is woken.
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listen_for_wakes(listener, schema)
        if row != "control-waiting":
            listener.execute(
                sql.SQL("UPDATE {}.wake_listeners SET below = -32768, new_only = %s").format(s),
                [row == "steady"],
            )
        job = _enqueue(conn, schema, "'noop'")
        conn.commit()
        notices = [n.payload for n in listener.notifies(timeout=0.5)]
    assert notices == ([f"default 0 {job}"] if row == "control-waiting" else [])


def test_a_dedupe_key_returns_the_live_job_or_the_recent_one(
    queue: Queue, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = _enqueue(conn, schema, "'noop', dedupe_key => 'report-7'")
        assert _enqueue(conn, schema, "'noop', dedupe_key => 'report-7'") == first
        assert queue.enqueue(apps.noop.job(), dedupe_key="report-7") == first  # one key space
        drain(apps.queue, dsn=dsn, schema=schema)
        window = "'noop', dedupe_key => 'report-7', dedupe_window => interval '1 hour'"
        assert _enqueue(conn, schema, window) == first  # finished within the window
        again = _enqueue(conn, schema, "'noop', dedupe_key => 'report-7'")
        assert again != first  # no window: a finished job does not count
        assert count(conn, schema, "jobs") == 1


def test_two_transactions_enqueueing_one_key_store_one_job(
    queue: Queue, dsn: str, schema: str
) -> None:
    """The second waits for the first on the key's unique index, then returns its job."""
    import threading

    with psycopg.connect(dsn) as first_conn:
        first = _enqueue(first_conn, schema, "'noop', dedupe_key => 'once'")
        got: list[int] = []

        def second() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                got.append(_enqueue(conn, schema, "'noop', dedupe_key => 'once'"))

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive()  # waiting on the first's uncommitted key
        first_conn.commit()
        thread.join(timeout=30)
    assert got == [first]
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 1


def _enqueue_many(conn: psycopg.Connection[Any], schema: str, jobs: str) -> list[int]:
    rows = conn.execute(
        sql.SQL("SELECT * FROM {}.enqueue_many(%s::jsonb)").format(sql.Identifier(schema)), [jobs]
    ).fetchall()
    return [int(row[0]) for row in rows]


def test_enqueue_many_stores_each_job_as_enqueue_does_in_the_order_given(
    queue: Queue, dsn: str, schema: str
) -> None:
    jobs = """[
        {"task": "noop"},
        {"task": "sleepy", "args": {"seconds": 0}, "priority": -5, "max_attempts": 3,
         "tags": ["from-sql", "bulk"]},
        {"task": "noop", "queue": "default", "run_at": "2030-01-01T00:00:00Z"},
        {"task": "noop", "dedupe_key": "k", "dedupe_window": "1 hour"},
        {"task": "noop", "dedupe_key": "k"}
    ]"""
    with psycopg.connect(dsn) as conn:
        ids = _enqueue_many(conn, schema, jobs)
        conn.rollback()  # gone with the transaction
        assert count(conn, schema, "jobs") == 0
        ids = _enqueue_many(conn, schema, jobs)
        conn.commit()
    assert ids[:4] == sorted(ids[:4]) and ids[4] == ids[3]  # the key found its own job
    sleepy = queue.get_job(ids[1])
    assert sleepy is not None
    assert (sleepy.priority, sleepy.max_attempts, sleepy.tags) == (-5, 3, ["from-sql", "bulk"])
    later = queue.get_job(ids[2])
    assert later is not None and later.status == "scheduled"
    drain(apps.queue, dsn=dsn, schema=schema)
    for done in (ids[0], ids[1], ids[3]):
        ran = queue.get_job(done)
        assert ran is not None and ran.status == "succeeded"


@pytest.mark.parametrize(
    ("jobs", "says"),
    [
        ('{"task": "noop"}', "jobs is a JSON array of job objects"),
        ('[{"task": "noop"}, 7]', "job 2 is a JSON number, not an object"),
        ('[{"task": "noop", "queues": "x"}]', "job 1 has keys enqueue\\(\\) does not take: queues"),
        ('[{"task": "noop", "priority": "high"}]', "job 1: priority must be a JSON number"),
        ('[{"task": "noop", "priority": 1.5}]', "job 1: priority must be a whole number"),
        ('[{"task": "noop", "tags": ["a", 1]}]', "job 1: tags must be JSON strings"),
        ('[{"task": "noop"}, {"task": "bad name"}]', "task name 'bad name'"),
        ('[{"task": "noop", "priority": 1000}]', "priority"),
    ],
)
def test_enqueue_many_refuses_bad_input_and_stores_nothing(
    queue: Queue, dsn: str, schema: str, jobs: str, says: str
) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
            _enqueue_many(conn, schema, jobs)
        conn.rollback()
        assert count(conn, schema, "jobs") == 0
