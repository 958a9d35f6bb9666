"""Operator reports on a real database: queue counts, horizon holders, the jobs table, and the
watchdog's terminate, which must end only the session it was pointed at.

The database may be shared with other sessions and other test processes, whose transactions
are horizon holders too: every assertion is about the pids this test opened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import ConfigurationError, DatabaseError, Queue
from pgqueue.health import (
    HorizonHolder,
    QueueStats,
    horizon_holders,
    queue_stats,
    status,
    table_health,
    terminate,
)
from pgqueue.queries import query
from pgqueue.store.health import queue_activity
from pgqueue.testing import enqueued_jobs
from tests.conftest import claim_params, session, wait_until

# Run on each server CI tests against: health reads the server's statistics views.
pytestmark = pytest.mark.each_server


@pytest.fixture
def observer(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The operator's connection: autocommit, as the health functions ask."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


def idle_app() -> str:
    return f"pgq-test-idle-{uuid.uuid4().hex}"


def holder(observer: psycopg.Connection[Any], pid: int) -> HorizonHolder:
    """This pid's row in the report, once pg_stat_activity shows it idle in its transaction."""
    found: list[HorizonHolder] = []

    def listed() -> bool:
        found[:] = [h for h in horizon_holders(observer) if h.pid == pid]
        return bool(found) and found[0].state == "idle in transaction"

    wait_until(listed, timeout=10, what=f"pid {pid} listed as idle in transaction")
    return found[0]


def live_pids(observer: psycopg.Connection[Any], pids: list[int]) -> set[int]:
    rows = observer.execute(
        "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
    ).fetchall()
    return {row[0] for row in rows}


# -- horizon holders ---------------------------------------------------------------------------


def test_horizon_holders_lists_an_idle_repeatable_read_transaction_with_pid_and_application(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    app = idle_app()
    with session(dsn, app, hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        found = holder(observer, pid)
        pids = [h.pid for h in horizon_holders(observer)]

    assert pid in pids
    assert found.kind == "session"
    assert found.state == "idle in transaction"
    assert found.application_name == app
    assert found.backend_type == "client backend"
    assert found.query == "SELECT 1"
    assert found.xmin_age is not None and found.xmin_age >= 0
    assert found.age is not None and found.age >= timedelta(0)
    assert found.terminable


def test_horizon_holders_never_lists_the_calling_connection(dsn: str) -> None:
    # Not autocommit: the report's own transaction holds a snapshot while it reads.
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")
        pids = [h.pid for h in horizon_holders(conn)]
        assert conn.info.backend_pid not in pids


def test_horizon_holders_leaves_out_a_plain_idle_session(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    with session(dsn, idle_app(), hold_horizon=False) as plain:
        assert plain.info.backend_pid not in [h.pid for h in horizon_holders(observer)]


def test_horizon_holders_with_min_age_keeps_only_transactions_at_least_that_old(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    with session(dsn, idle_app(), hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        started = holder(observer, pid).xact_start
        assert started is not None
        an_hour_later = started + timedelta(hours=1)

        older = horizon_holders(observer, timedelta(minutes=59), now=an_hour_later)
        younger = horizon_holders(observer, timedelta(minutes=61), now=an_hour_later)

    assert pid in [h.pid for h in older]
    assert pid not in [h.pid for h in younger]


def test_pgqueue_connections_are_listed_but_not_terminable(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    with session(dsn, "pgqueue:claim", hold_horizon=True) as worker:
        found = holder(observer, worker.info.backend_pid)
    assert found.application_name == "pgqueue:claim"
    assert not found.terminable


# -- queue stats and the jobs table ------------------------------------------------------------


def _history(conn: psycopg.Connection[Any], schema: str, rows: list[dict[str, Any]]) -> None:
    """Finished jobs written straight into history, as a worker would have left them."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.job_history (id, queue, task, args, status, priority, attempt, "
            "max_attempts, run_at, created_at, finished_at) "
            "SELECT r.id, r.queue, 't.x', '{{}}', r.status, 0, 1, 1, r.at, r.at, r.at "
            "FROM jsonb_to_recordset(%s::jsonb) AS r(id bigint, queue text, status text, "
            "at timestamptz)"
        ).format(sql.Identifier(schema)),
        [json.dumps([{**r, "at": r["at"].isoformat()} for r in rows])],
    )


def _finished_around(now: datetime) -> list[dict[str, Any]]:
    """History on either side of the one-minute and one-hour bounds before `now`: of mail,
    a failure inside the hour and one outside, a success inside the minute, one inside the
    hour only and one after `now`; of "old", a failure inside the hour."""
    return [
        {"id": 9001, "queue": "mail", "status": "failed", "at": now - timedelta(minutes=59)},
        {"id": 9002, "queue": "mail", "status": "failed", "at": now - timedelta(minutes=61)},
        {"id": 9003, "queue": "mail", "status": "succeeded", "at": now - timedelta(seconds=30)},
        {"id": 9004, "queue": "mail", "status": "succeeded", "at": now - timedelta(minutes=5)},
        {"id": 9005, "queue": "mail", "status": "succeeded", "at": now + timedelta(seconds=1)},
        {"id": 9006, "queue": "old", "status": "failed", "at": now - timedelta(minutes=1)},
    ]


def _claim(conn: psycopg.Connection[Any], schema: str, queue_name: str, limit: int) -> int:
    """One claim of up to `limit` jobs as a registered worker does: they are 'running', or
    'waiting' if their concurrency key is full. Returns how many it picked."""
    worker = conn.execute(
        query("worker_register", schema),
        {
            "name": "test",
            "hostname": "test",
            "pid": 1,
            "queues": [queue_name],
            "concurrency": 1,
            "client_pid": None,  # no session recorded: a hand-made worker
        },
    ).fetchone()
    assert worker is not None
    params = claim_params(queue_name, limit, worker[0])
    return len(conn.execute(query("job_claim", schema), params).fetchall())


def test_queue_stats_counts_live_jobs_and_the_last_hour_of_history_per_queue(
    queue: Queue, schema: str, observer: psycopg.Connection[Any]
) -> None:
    mail = queue.task(name="t.mail", queue="mail")(lambda i: None)
    later = queue.task(name="t.later", queue="reports", delay=3600)(lambda i: None)
    queue.enqueue_many([mail.job(i) for i in range(3)] + [later.job(i) for i in range(2)])
    assert _claim(observer, schema, "mail", limit=1) == 1
    now = datetime.fromisoformat("2030-01-01T12:00:00+00:00")
    _history(observer, schema, _finished_around(now))
    queued_since = min(j.run_at for j in enqueued_jobs(observer, queue) if j.status == "queued")

    stats = queue_stats(observer, schema, now=now)

    assert stats == [
        QueueStats(
            queue="mail",
            queued=2,
            scheduled=0,
            running=1,
            waiting=0,
            failed_last_hour=1,
            succeeded_last_minute=1,
            succeeded_last_hour=2,
            oldest_queued_age=now - queued_since,
        ),
        QueueStats(
            queue="old",
            queued=0,
            scheduled=0,
            running=0,
            waiting=0,
            failed_last_hour=1,
            succeeded_last_minute=0,
            succeeded_last_hour=0,
            oldest_queued_age=None,
        ),
        QueueStats(
            queue="reports",
            queued=0,
            scheduled=2,
            running=0,
            waiting=0,
            failed_last_hour=0,
            succeeded_last_minute=0,
            succeeded_last_hour=0,
            oldest_queued_age=None,
        ),
    ]


def test_queue_activity_reads_short_ranges_of_history_for_served_and_paused_queues(
    queue: Queue, schema: str, observer: psycopg.Connection[Any]
) -> None:
    mail = queue.task(name="t.mail", queue="mail")(lambda i: None)
    queue.enqueue_many([mail.job(i) for i in range(3)])
    assert _claim(observer, schema, "mail", limit=1) == 1  # a worker now serves mail
    queue.pause_queue("quiet")
    now = datetime.fromisoformat("2030-01-01T12:00:00+00:00")
    _history(observer, schema, _finished_around(now))

    found = {a.queue: a for a in queue_activity(observer, schema, now=now)}

    # A queue with only history, no live job, worker or pause, is not listed.
    assert set(found) == {"mail", "quiet"}
    mail_now = found["mail"]
    assert (mail_now.queued, mail_now.running, mail_now.paused) == (2, 1, False)
    assert (mail_now.succeeded_last_minute, mail_now.failed_last_hour) == (1, 1)
    quiet = found["quiet"]
    assert quiet.paused and (quiet.queued, quiet.failed_last_hour) == (0, 0)


def test_queue_activity_reads_with_jit_off_and_leaves_the_session_as_it_was(
    dsn: str, schema: str, queue: Queue
) -> None:
    with psycopg.connect(dsn, options="-c jit=on") as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open: the read joins it
        queue_activity(conn, schema)
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("off",)
        conn.commit()  # the transaction ends, and the setting with it
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("on",)
        conn.commit()
        conn.autocommit = True  # as the dashboard's connections are: its own transaction
        queue_activity(conn, schema)
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("on",)


def test_queue_stats_counts_jobs_parked_by_their_concurrency_key_as_waiting_per_queue(
    queue: Queue, schema: str, observer: psycopg.Connection[Any]
) -> None:
    mail = queue.task(name="t.mail", queue="mail")(lambda i: None)
    other = queue.task(name="t.other", queue="other")(lambda i: None)
    queue.set_concurrency_limit("tenant:1", 1)
    queue.enqueue_many([mail.with_options(concurrency_key="tenant:1").job(i) for i in range(4)])
    queue.enqueue_many([other.job(i) for i in range(2)])
    # Admits 1 job of tenant:1 and parks the other 3.
    assert _claim(observer, schema, "mail", limit=10) == 4

    stats = {s.queue: s for s in queue_stats(observer, schema)}

    counts = {q: (s.queued, s.running, s.waiting) for q, s in stats.items()}
    assert counts == {"mail": (0, 1, 3), "other": (2, 0, 0)}
    assert stats["mail"].oldest_queued_age is None  # waiting jobs are not queued


def test_queue_stats_of_an_unmigrated_schema_raises_database_error_naming_it(
    observer: psycopg.Connection[Any],
) -> None:
    with pytest.raises(DatabaseError, match="'pgq_test_never_migrated' has no pgqueue tables"):
        queue_stats(observer, "pgq_test_never_migrated")
    with pytest.raises(DatabaseError, match="'pgq_test_never_migrated' has no pgqueue tables"):
        table_health(observer, "pgq_test_never_migrated")


def test_table_health_reports_dead_rows_and_the_last_vacuum_of_the_jobs_table(
    dsn: str, queue: Queue, schema: str, observer: psycopg.Connection[Any]
) -> None:
    t = queue.task(name="t")(lambda i: None)
    queue.enqueue_many([t.job(i) for i in range(10)])
    # The deleting backend reports its statistics when it exits.
    with psycopg.connect(dsn, autocommit=True) as writer:
        writer.execute(sql.SQL("DELETE FROM {}.jobs").format(sql.Identifier(schema)))

    def dead_rows_reported() -> bool:
        health = table_health(observer, schema)
        return health.n_dead_tup >= 10 and health.n_live_tup == 0

    wait_until(dead_rows_reported, timeout=30, what="10 dead rows in pg_stat_user_tables")
    assert table_health(observer, schema).last_vacuum is None
    observer.execute(sql.SQL("VACUUM {}.jobs").format(sql.Identifier(schema)))
    wait_until(
        lambda: table_health(observer, schema).last_vacuum is not None,
        timeout=30,
        what="last_vacuum to be set",
    )
    health = table_health(observer, schema)
    assert (health.schema_name, health.table_name) == (schema, "jobs")


def test_status_gathers_queues_holders_and_the_jobs_table(
    dsn: str, queue: Queue, schema: str, observer: psycopg.Connection[Any]
) -> None:
    t = queue.task(name="t", queue="mail")(lambda: None)
    queue.enqueue(t.job())
    with session(dsn, idle_app(), hold_horizon=True) as idle:
        holder(observer, idle.info.backend_pid)
        report = status(observer, schema)
        assert idle.info.backend_pid in [h.pid for h in report.holders]
    assert report.schema_name == schema
    assert [(q.queue, q.queued) for q in report.queues] == [("mail", 1)]
    assert report.jobs_table.table_name == "jobs"


# -- terminate ---------------------------------------------------------------------------------


def test_terminate_ends_the_idle_holder_and_spares_an_idle_session_and_a_pgqueue_worker(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    with (
        session(dsn, idle_app(), hold_horizon=True) as victim,
        session(dsn, idle_app(), hold_horizon=False) as bystander,
        session(dsn, "pgqueue:claim", hold_horizon=True) as worker,
    ):
        pids = [c.info.backend_pid for c in (victim, bystander, worker)]
        holder(observer, pids[0])
        holder(observer, pids[2])

        # All three are asked for: the statement's guard picks the one it may end.
        terminated = terminate(observer, pids)

        assert terminated == [pids[0]]
        wait_until(lambda: pids[0] not in live_pids(observer, pids), what="the victim to exit")
        assert live_pids(observer, pids) == {pids[1], pids[2]}
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        assert victim.broken
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        assert worker.execute("SELECT 1").fetchone() == (1,)


def test_terminate_spares_an_open_transaction_that_holds_no_snapshot(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    # READ COMMITTED drops its snapshot between statements: open, but not holding VACUUM back.
    with session(dsn, idle_app(), hold_horizon=False) as open_tx:
        open_tx.execute("BEGIN")
        open_tx.execute("SELECT 1")
        pid = open_tx.info.backend_pid
        wait_until(
            lambda: (
                observer.execute(
                    "SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]
                ).fetchone()
                == ("idle in transaction",)
            ),
            what=f"pid {pid} idle in transaction",
        )
        assert pid not in [h.pid for h in horizon_holders(observer)]
        assert terminate(observer, [pid]) == []
        assert open_tx.execute("SELECT 1").fetchone() == (1,)


def test_terminate_never_ends_the_calling_connection(observer: psycopg.Connection[Any]) -> None:
    # While the statement runs, the caller holds a snapshot: only the pid guard spares it.
    assert terminate(observer, [observer.info.backend_pid]) == []
    assert observer.execute("SELECT 1").fetchone() == (1,)


def test_terminate_spares_a_holder_younger_than_min_age(
    dsn: str, observer: psycopg.Connection[Any]
) -> None:
    with session(dsn, idle_app(), hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        started = holder(observer, pid).xact_start
        assert started is not None
        half_a_minute_later = started + timedelta(seconds=30)

        spared = terminate(observer, [pid], min_age=timedelta(minutes=1), now=half_a_minute_later)
        assert spared == []
        assert idle.execute("SELECT 1").fetchone() == (1,)

        ended = terminate(observer, [pid], min_age=timedelta(seconds=10), now=half_a_minute_later)
        assert ended == [pid]


def test_terminate_refuses_a_connection_inside_a_transaction(dsn: str) -> None:
    with (
        psycopg.connect(dsn) as conn,
        pytest.raises(ConfigurationError, match="autocommit connection"),
    ):
        terminate(conn, [1])
