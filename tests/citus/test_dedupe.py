"""Dedupe keys on Citus, held per shard value: a second enqueue with a key and shard value
whose job is live, or finished within its window, returns that job and stores nothing; the
same key on another shard value is another job. Every statement names its shard, so a keyed
job enqueued beside its order still commits on one node."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue.citus import CitusQueue, CitusWorker
from pgqueue.models import Enqueued, NewJob
from pgqueue.store.citus import dedupe_statements
from tests.citus import app
from tests.citus.conftest import values_on_two_nodes
from tests.conftest import wait_until

pytestmark = pytest.mark.citus

WINDOW = timedelta(minutes=10)


@pytest.fixture
def queue(
    coordinator: str, citus_schema: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CitusQueue]:
    """The schema's queue, an orders table colocated with its jobs, and the runs table the
    app's tasks write to when a worker runs them here."""
    with psycopg.connect(coordinator, autocommit=True) as conn:
        app.runs_table(conn, citus_schema)
        orders = (
            "CREATE TABLE {}.orders (tenant_id text, id bigserial, PRIMARY KEY (tenant_id, id))"
        )
        conn.execute(sql.SQL(orders).format(sql.Identifier(citus_schema)))
        conn.execute(
            "SELECT create_distributed_table(%s, 'tenant_id', colocate_with => %s)",
            [f"{citus_schema}.orders", f"{citus_schema}.jobs"],
        )
    monkeypatch.setenv("CITUS_APP_DSN", coordinator)
    monkeypatch.setenv("CITUS_APP_SCHEMA", citus_schema)
    q = CitusQueue(coordinator, schema=citus_schema)
    yield q
    q.close()


def _keyed(tenant: str, n: int, key: str = "once", window: timedelta | None = None) -> NewJob:
    return app.record.with_options(dedupe_key=key, dedupe_window=window).job(tenant_id=tenant, n=n)


def _burst(coordinator: str, schema: str) -> CitusWorker:
    """A worker of the app's tasks, run here until nothing is left to claim."""
    return CitusWorker(app.queue, dsn=coordinator, schema=schema, burst=True, poll_interval=0.05)


def _jobs(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    """Every live job as (id, shard, dedupe_key, n)."""
    query = sql.SQL("SELECT id, shard, dedupe_key, (args ->> 'n')::int FROM {}.jobs ORDER BY id")
    return conn.execute(query.format(sql.Identifier(schema))).fetchall()


def _created(ids: list[Enqueued]) -> list[bool]:
    return [job_id.created for job_id in ids]


def test_dedupe_same_key_and_shard_value_is_one_job(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    first = queue.enqueue(_keyed("acme", 1))
    second = queue.enqueue(_keyed("acme", 2))
    assert second == first and (first.created, second.created) == (True, False)
    with psycopg.connect(coordinator) as conn:
        assert _jobs(conn, citus_schema) == [(first, "acme", "once", 1)]


def test_dedupe_same_key_on_another_shard_value_is_another_job(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as conn:
        one, other = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        ids = [queue.enqueue(_keyed(one, 1)), queue.enqueue(_keyed(other, 2))]
        assert ids[0] != ids[1] and _created(ids) == [True, True]
        assert [row[1:] for row in _jobs(conn, citus_schema)] == [
            (one, "once", 1),
            (other, "once", 2),
        ]


def test_dedupe_in_the_callers_transaction_commits_with_its_order_on_one_node(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    with psycopg.connect(coordinator) as conn:
        sent: list[str] = []
        conn.add_notice_handler(lambda notice: sent.append(notice.message_primary or ""))
        conn.execute("SET citus.log_remote_commands TO on")
        conn.execute(
            sql.SQL("INSERT INTO {}.orders (tenant_id) VALUES ('acme')").format(
                sql.Identifier(citus_schema)
            )
        )
        first = queue.enqueue(_keyed("acme", 1, window=WINDOW), conn=conn)
        again = queue.enqueue(_keyed("acme", 2, window=WINDOW), conn=conn)
    assert again == first and _created([first, again]) == [True, False]
    assert any("COMMIT" in command for command in sent), sent
    assert not any("PREPARE TRANSACTION" in command for command in sent), sent
    later = queue.enqueue(_keyed("acme", 3))
    assert later == first and not later.created


def test_dedupe_rolled_back_job_leaves_its_key_free(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    with psycopg.connect(coordinator) as conn:
        gone = queue.enqueue(_keyed("acme", 1), conn=conn)
        conn.rollback()
    fresh = queue.enqueue(_keyed("acme", 2))
    assert fresh != gone and fresh.created
    assert queue.get_job(gone) is None
    with psycopg.connect(coordinator) as conn:
        assert _jobs(conn, citus_schema) == [(fresh, "acme", "once", 2)]


def test_dedupe_waits_for_a_concurrent_enqueue_of_the_key_and_returns_its_job(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    got: list[Enqueued] = []
    with psycopg.connect(coordinator) as first, psycopg.connect(coordinator) as watch:
        winner = queue.enqueue(_keyed("acme", 1), conn=first)
        racer = threading.Thread(target=lambda: got.append(queue.enqueue(_keyed("acme", 2))))
        racer.start()
        waits = "SELECT count(*) FROM citus_lock_waits"
        wait_until(
            lambda: watch.execute(waits).fetchone() != (0,),
            what="the second enqueue to wait on the first",
        )
        first.commit()
        racer.join(timeout=30)
    assert got == [winner] and not got[0].created
    with psycopg.connect(coordinator) as conn:
        assert len(_jobs(conn, citus_schema)) == 1


def test_dedupe_window_returns_the_job_a_worker_finished_within_it(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    done = queue.enqueue(_keyed("acme", 1, window=WINDOW))
    asyncio.run(_burst(coordinator, citus_schema).run_async())
    finished = queue.get_job(done)
    assert finished is not None and finished.status == "succeeded"
    within = queue.enqueue(_keyed("acme", 2, window=WINDOW))
    assert within == done and not within.created
    elsewhere = queue.enqueue(_keyed("globex", 3, window=WINDOW))
    assert elsewhere.created
    unwindowed = queue.enqueue(_keyed("acme", 4))
    assert unwindowed != done and unwindowed.created
    with psycopg.connect(coordinator) as conn:
        assert [row[1:] for row in _jobs(conn, citus_schema)] == [
            ("globex", "once", 3),
            ("acme", "once", 4),
        ]


def test_dedupe_window_lets_a_job_finished_before_it_run_again(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    done = queue.enqueue(_keyed("acme", 1, window=WINDOW))
    asyncio.run(_burst(coordinator, citus_schema).run_async())
    with psycopg.connect(coordinator) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.job_history SET finished_at = now() - interval '1 hour' "
                "WHERE shard = 'acme' AND id = %s"
            ).format(sql.Identifier(citus_schema)),
            [done],
        )
    again = queue.enqueue(_keyed("acme", 2, window=WINDOW))
    assert again != done and again.created


def test_dedupe_enqueue_many_keeps_one_job_per_key_and_shard_value(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    existing = queue.enqueue(_keyed("acme", 0, key="old"))
    ids = queue.enqueue_many(
        [
            _keyed("acme", 1),
            app.record.job(tenant_id="acme", n=2),
            _keyed("acme", 3),
            _keyed("globex", 4),
            _keyed("acme", 5, key="old"),
            _keyed("globex", 6),
        ]
    )
    assert _created(ids) == [True, True, False, True, False, False]
    assert ids[2] == ids[0] and ids[5] == ids[3] and ids[4] == existing
    assert len(set(ids)) == 4
    with psycopg.connect(coordinator) as conn:
        stored = {row[0]: row[1:] for row in _jobs(conn, citus_schema)}
    assert stored == {
        existing: ("acme", "old", 0),
        ids[0]: ("acme", "once", 1),
        ids[1]: ("acme", None, 2),
        ids[3]: ("globex", "once", 4),
    }


@pytest.mark.parametrize("name", sorted(dedupe_statements("pgqueue")))
def test_dedupe_statements_run_as_one_task_on_the_shards_node(
    coordinator: str, citus_schema: str, name: str
) -> None:
    params = {
        "shard": "acme", "queue": "default", "task": "citus.record", "args": "{}",
        "priority": 0, "max_attempts": 3, "run_at": None, "delay": None,
        "concurrency_key": None, "tags": None, "trace_context": None,
        "dedupe_key": "once", "dedupe_window": 60.0, "now": None,
    }  # fmt: skip
    explain = sql.SQL("EXPLAIN ") + dedupe_statements(citus_schema)[name]
    with psycopg.connect(coordinator) as conn:
        plan = "\n".join(row[0] for row in conn.execute(explain, params).fetchall())
        conn.rollback()
    assert "Task Count: 1" in plan and "Subplan" not in plan, plan
