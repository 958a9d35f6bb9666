"""Enqueue on a Citus cluster, in the application's own transaction: a job beside the order it
belongs to commits on one node without two-phase commit; jobs on two nodes commit by
two-phase commit, and no NOTIFY makes that fail; a rollback leaves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import ConfigurationError
from pgqueue.citus import CitusQueue
from pgqueue.errors import CitusUnsupportedError
from tests.citus import app
from tests.citus.conftest import node_of, values_on_two_nodes

pytestmark = pytest.mark.citus


@pytest.fixture
def shop(coordinator: str, citus_schema: str) -> Iterator[CitusQueue]:
    """The schema's queue, and an orders table distributed by tenant and colocated with the
    jobs, as an application lays its own tables out."""
    with psycopg.connect(coordinator, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.orders (tenant_id text, id bigserial, total int, "
                "PRIMARY KEY (tenant_id, id))"
            ).format(sql.Identifier(citus_schema))
        )
        conn.execute(
            "SELECT create_distributed_table(%s, 'tenant_id', colocate_with => %s)",
            [f"{citus_schema}.orders", f"{citus_schema}.jobs"],
        )
    queue = CitusQueue(coordinator, schema=citus_schema)
    yield queue
    queue.close()


def _remote_commands(conn: psycopg.Connection[Any]) -> list[str]:
    """What the coordinator sends the nodes for `conn` from now on (Citus says it in notices)."""
    sent: list[str] = []
    conn.add_notice_handler(lambda notice: sent.append(notice.message_primary or ""))
    conn.execute("SET citus.log_remote_commands TO on")
    return sent


def _prepared(sent: list[str]) -> bool:
    return any("PREPARE TRANSACTION" in command for command in sent)


def _rows(conn: psycopg.Connection[Any], schema: str, table: str) -> list[tuple[Any, ...]]:
    query = sql.SQL("SELECT * FROM {}.{} ORDER BY 1").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    return conn.execute(query).fetchall()


def _place_order(conn: psycopg.Connection[Any], schema: str, tenant: str) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {}.orders (tenant_id, total) VALUES (%s, 10)").format(
            sql.Identifier(schema)
        ),
        [tenant],
    )


def test_a_job_enqueued_with_its_order_commits_on_one_node_without_two_phase_commit(
    coordinator: str, citus_schema: str, shop: CitusQueue
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as watch:
        with psycopg.connect(coordinator) as conn:
            sent = _remote_commands(conn)
            _place_order(conn, citus_schema, "acme")
            job_id = shop.enqueue_many([app.record.job(tenant_id="acme", n=1)], conn=conn)[0]
        assert any("COMMIT" in command for command in sent), sent
        assert not _prepared(sent), sent
        job = shop.get_job(job_id)
        assert job is not None and job.status == "queued"
        assert len(_rows(watch, citus_schema, "orders")) == 1
        shard = watch.execute(
            sql.SQL("SELECT shard FROM {}.jobs WHERE id = %s").format(sql.Identifier(citus_schema)),
            [job_id],
        ).fetchone()
        assert shard == ("acme",)


def test_a_rolled_back_order_takes_its_job_with_it(
    coordinator: str, citus_schema: str, shop: CitusQueue
) -> None:
    with psycopg.connect(coordinator) as conn:
        _place_order(conn, citus_schema, "acme")
        job_id = shop.enqueue_many([app.record.job(tenant_id="acme", n=1)], conn=conn)[0]
        conn.rollback()
    with psycopg.connect(coordinator) as conn:
        assert _rows(conn, citus_schema, "orders") == []
        assert _rows(conn, citus_schema, "jobs") == []
    assert shop.get_job(job_id) is None


def test_jobs_on_two_nodes_commit_by_two_phase_commit_without_a_notify_failing_it(
    coordinator: str, citus_schema: str, shop: CitusQueue
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as watch:
        first, second = values_on_two_nodes(watch, f"{citus_schema}.jobs")
        assert node_of(watch, f"{citus_schema}.jobs", first) != node_of(
            watch, f"{citus_schema}.jobs", second
        )
        with psycopg.connect(coordinator) as conn:
            sent = _remote_commands(conn)
            _place_order(conn, citus_schema, first)
            _place_order(conn, citus_schema, second)
            jobs = [app.record.job(tenant_id=first, n=1), app.record.job(tenant_id=second, n=2)]
            ids = shop.enqueue_many(jobs, conn=conn)
        assert _prepared(sent), sent
        assert sum("COMMIT PREPARED" in command for command in sent) == 2, sent
        assert len(_rows(watch, citus_schema, "orders")) == 2
    assert [shop.get_job(i).status for i in ids] == ["queued", "queued"]  # type: ignore[union-attr]


def test_jobs_on_two_nodes_roll_back_together(
    coordinator: str, citus_schema: str, shop: CitusQueue
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as watch:
        first, second = values_on_two_nodes(watch, f"{citus_schema}.jobs")
    with psycopg.connect(coordinator) as conn:
        _place_order(conn, citus_schema, first)
        shop.enqueue_many(
            [app.record.job(tenant_id=first, n=1), app.record.job(tenant_id=second, n=2)],
            conn=conn,
        )
        conn.rollback()
    with psycopg.connect(coordinator) as conn:
        assert _rows(conn, citus_schema, "orders") == []
        assert _rows(conn, citus_schema, "jobs") == []


def test_an_enqueue_without_a_transaction_of_the_callers_commits_at_once(
    coordinator: str, citus_schema: str, shop: CitusQueue
) -> None:
    job_id = shop.enqueue_many([app.record.job(tenant_id="solo", n=1)])[0]
    with psycopg.connect(coordinator) as conn:
        assert len(_rows(conn, citus_schema, "jobs")) == 1
    assert shop.get_job(job_id) is not None


@pytest.mark.parametrize(
    "options",
    [{"fairness_key": "acme"}, {"limits": ["tenant:acme"]}],
    ids=["fairness_key", "limits"],
)
def test_options_citus_cannot_keep_are_refused_before_anything_is_sent(
    shop: CitusQueue, options: dict[str, Any]
) -> None:
    with pytest.raises(CitusUnsupportedError, match="not available on Citus"):
        shop.enqueue_many([app.record.with_options(**options).job(tenant_id="acme", n=1)])


def test_queue_methods_citus_cannot_run_are_refused(shop: CitusQueue) -> None:
    with pytest.raises(CitusUnsupportedError, match=r"Queue\.cancel_job is not available on Citus"):
        shop.cancel_job(1)
    with pytest.raises(CitusUnsupportedError, match=r"Queue\.retry_job"):
        shop.retry_job(1)
    assert issubclass(CitusUnsupportedError, ConfigurationError)


def test_enqueue_in_sql_refuses_on_citus_saying_why(coordinator: str, citus_schema: str) -> None:
    with (
        psycopg.connect(coordinator) as conn,
        pytest.raises(psycopg.errors.FeatureNotSupported, match="not available on Citus"),
    ):
        conn.execute(
            sql.SQL("SELECT {}.enqueue('citus.record', '{{}}')").format(
                sql.Identifier(citus_schema)
            )
        )


def test_a_concurrency_key_places_the_job_and_is_kept(shop: CitusQueue) -> None:
    job_id = shop.enqueue_many([app.record.with_options(concurrency_key="k1").job(
        tenant_id="acme", n=1
    )])[0]  # fmt: skip
    job = shop.get_job(job_id)
    assert job is not None and job.concurrency_key == "k1"


def test_an_atomic_task_is_refused_at_enqueue(shop: CitusQueue) -> None:
    @shop.task(name="citus.atomic_enqueue", atomic=True)
    def atomic() -> None: ...

    with pytest.raises(CitusUnsupportedError, match="atomic tasks"):
        shop.enqueue(atomic.job())
