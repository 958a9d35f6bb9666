"""History retention on a real PostgreSQL: `prune` deletes exactly what its cutoff selects,
in bounded batches, and workers with history_retention prune one at a time."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import ConfigurationError, Queue, Worker
from pgqueue.history.retention import Cutoff, Pruner, prune
from pgqueue.runtime.link import Link
from tests.conftest import count, wait_until, worker_in_thread

# Run on each server CI tests against: retention detaches the server's partitions.
pytestmark = pytest.mark.each_server

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=timezone.utc)


def add_history(
    conn: psycopg.Connection[Any],
    schema: str,
    rows: int,
    *,
    age: timedelta,
    status: str = "succeeded",
    queue: str = "default",
    now: datetime = NOW,
) -> None:
    """`rows` finished jobs that finished `age` before `now`."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.job_history (id, queue, task, args, status, priority, attempt,"
            " max_attempts, run_at, created_at, started_at, finished_at)"
            " SELECT nextval(pg_get_serial_sequence({}, 'id')), %(queue)s, 't', '{{}}',"
            " %(status)s, 0, 1, 1, f, f, f, f"
            " FROM (SELECT %(at)s::timestamptz AS f FROM generate_series(1, %(rows)s)) AS g"
        ).format(sql.Identifier(schema), sql.Literal(f"{schema}.jobs")),
        {"queue": queue, "status": status, "at": now - age, "rows": rows},
    )
    conn.commit()


def history(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL(
            "SELECT status, queue, count(*) FROM {}.job_history GROUP BY 1, 2 ORDER BY 1, 2"
        ).format(sql.Identifier(schema))
    ).fetchall()


def test_prune_deletes_only_what_finished_before_the_cutoff_in_bounded_batches(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    add_history(conn, schema, 35, age=timedelta(days=8))
    add_history(conn, schema, 5, age=timedelta(days=6))
    with psycopg.connect(dsn, autocommit=True) as own:
        report = prune(own, schema, Cutoff(timedelta(days=7), batch_size=10), now=NOW)
    assert report.deleted == 35
    assert report.batches == 4 + 1  # 10, 10, 10, 5 history rows; then one (empty) ticks batch
    assert history(conn, schema) == [("succeeded", "default", 5)]


def test_prune_keeps_other_statuses_and_queues_when_told(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    old = timedelta(days=30)
    add_history(conn, schema, 3, age=old, status="succeeded", queue="mail")
    add_history(conn, schema, 3, age=old, status="failed", queue="mail")
    add_history(conn, schema, 3, age=old, status="succeeded", queue="billing")
    with psycopg.connect(dsn, autocommit=True) as own:
        cutoff = Cutoff(timedelta(days=7), statuses=("succeeded",), queue="mail")
        assert prune(own, schema, cutoff, now=NOW).deleted == 3
    assert history(conn, schema) == [("failed", "mail", 3), ("succeeded", "billing", 3)]


def test_prune_refuses_a_status_history_cannot_hold() -> None:
    with pytest.raises(ConfigurationError, match="'queued'"):
        Cutoff(timedelta(days=1), statuses=("queued",))


def test_prune_removes_old_periodic_ticks_but_never_one_a_pass_may_still_need(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    ident = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.periodic (name, definition, last_tick) VALUES ('p', '{{}}', %s)"
        ).format(ident),
        [NOW - timedelta(days=9)],
    )
    conn.execute(
        sql.SQL("INSERT INTO {}.periodic_ticks (name, tick) VALUES ('p', %s), ('p', %s)").format(
            ident
        ),
        [NOW - timedelta(days=10), NOW - timedelta(days=8)],  # the second is after last_tick
    )
    conn.commit()
    with psycopg.connect(dsn, autocommit=True) as own:
        report = prune(own, schema, Cutoff(timedelta(days=7)), now=NOW)
    assert report.ticks_deleted == 1
    assert count(conn, schema, "periodic_ticks") == 1


def test_one_worker_prunes_at_a_time(dsn: str, schema: str, conn: psycopg.Connection[Any]) -> None:
    add_history(conn, schema, 20, age=timedelta(days=8))
    pruner = Pruner(schema, timedelta(days=7), timedelta(minutes=10), batch=10)

    async def run() -> Any:
        link = Link(dsn, "prune")
        try:
            return await pruner.prune_once(link, now=NOW)
        finally:
            await link.close()

    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('pgqueue.prune'), hashtext(%s))", [schema])
        held = asyncio.run(run())
        assert held.locked_out and held.deleted == 0
        assert count(conn, schema, "job_history") == 20
    free = asyncio.run(run())
    assert not free.locked_out and free.deleted == 20


def test_a_worker_with_history_retention_prunes_on_its_own(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    conn.commit()
    add_history(conn, schema, 25, age=timedelta(hours=2), now=now)
    add_history(conn, schema, 4, age=timedelta(minutes=10), now=now)
    queue = Queue(dsn, schema=schema)
    worker = Worker(
        queue,
        dsn=dsn,
        history_retention=timedelta(hours=1),
        prune_interval=timedelta(seconds=1),
        prune_batch=10,
    )
    with worker_in_thread(worker):
        wait_until(
            lambda: worker.current.pruner is not None and worker.current.pruner.runs > 0,
            what="a prune",
        )
        assert count(conn, schema, "job_history") == 4
    assert worker.current.pruner is not None and worker.current.pruner.deleted == 25
    queue.close()


def test_history_retention_is_validated_with_its_range() -> None:
    with pytest.raises(ConfigurationError, match="history_retention"):
        Worker(Queue(), dsn="postgresql://x", history_retention=timedelta(seconds=5))
