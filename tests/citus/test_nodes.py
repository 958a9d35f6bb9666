"""A Citus worker's statements on the shard's own node: found from the coordinator's metadata,
sent on the node's own connection, planned there as plain PostgreSQL on the shard's tables."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import tuple_row

from pgqueue.citus import CitusQueue
from pgqueue.citus.routes import Nodes
from pgqueue.models import ClaimedJob
from pgqueue.queries import Tables
from pgqueue.runtime.link import Link
from pgqueue.store import citus as store
from pgqueue.store.plan import AsyncConn
from tests.citus import app
from tests.citus.conftest import node_of, values_on_two_nodes

pytestmark = pytest.mark.citus

PARAMS = {"queues": ["default"], "limit": 10, "worker_id": 1}


def test_a_claim_runs_on_its_shards_node_as_a_plain_statement_on_the_shards_tables(
    coordinator: str, citus_schema: str
) -> None:
    queue = CitusQueue(coordinator, schema=citus_schema)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        shards = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        homes = [node_of(conn, f"{citus_schema}.jobs", shard) for shard in shards]
    ids = [queue.enqueue(app.record.job(tenant_id=shard, n=0)) for shard in shards]
    queue.close()

    async def claim(shard: str) -> tuple[int, str, list[int]]:
        async def on_node(conn: AsyncConn, tables: Tables) -> tuple[int, str, list[int]]:
            explain = sql.SQL("EXPLAIN ") + store.claim_statement(citus_schema, tables)
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(explain, {"shard": shard, **PARAMS})
                plan = "\n".join(row[0] for row in await cur.fetchall())
            jobs = await store.claim(conn, citus_schema, shard, ["default"], 10, 1, tables)
            return conn.info.port, plan, [job.id for job in jobs]

        link = Link(coordinator, "test")
        nodes = Nodes(coordinator, citus_schema, link)
        try:
            await nodes.locate([shard])
            return await nodes.run(shard, on_node)
        finally:
            await nodes.close()
            await link.close()

    for shard, home, job_id in zip(shards, homes, ids, strict=True):
        port, plan, claimed = asyncio.run(claim(shard))
        assert port == home
        assert "Citus" not in plan and "LockRows" in plan, plan
        assert claimed == [job_id]
    with psycopg.connect(coordinator) as conn:
        running = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'running'").format(
                sql.Identifier(citus_schema)
            )
        ).fetchone()
    assert running == (2,)


def test_a_node_that_cannot_be_reached_fails_its_statements_and_not_the_others(
    coordinator: str, citus_schema: str
) -> None:
    with psycopg.connect(coordinator, autocommit=True) as conn:
        first, second = values_on_two_nodes(conn, f"{citus_schema}.jobs")

    def claim(shard: str) -> Callable[[AsyncConn, Tables], Awaitable[list[ClaimedJob]]]:
        return lambda conn, tables: store.claim(
            conn, citus_schema, shard, ["default"], 10, 1, tables
        )

    async def run() -> tuple[str, list[ClaimedJob]]:
        link = Link(coordinator, "test")
        nodes = Nodes(coordinator, citus_schema, link)
        await nodes.locate([first, second])
        # As if the cluster knew the first shard's node by a name this host cannot reach.
        nodes._placed[first] = dataclasses.replace(nodes._placed[first], port=1)
        try:
            with pytest.raises(psycopg.OperationalError) as failed:
                await nodes.run(first, claim(first))
            return str(failed.value), await nodes.run(second, claim(second))
        finally:
            await nodes.close()
            await link.close()

    failed, claimed = asyncio.run(run())
    assert "node 127.0.0.1:1" in failed
    assert claimed == []
