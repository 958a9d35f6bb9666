"""A Citus worker's statements on the nodes: each shard table's backlog read and its jobs
claimed on the node that holds it, found from the coordinator's metadata, as plain
PostgreSQL on the shard's own tables, every shard value in the table at once."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

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

PARAMS: dict[str, Any] = {"shard": None, "queues": ["default"], "limit": 10, "worker_id": 1}


def _shard_key(conn: psycopg.Connection[Any], schema: str, value: str) -> str:
    """The key a worker on the nodes names `value`'s shard by: its jobs shard's id."""
    row = conn.execute(
        "SELECT get_shard_id_for_distribution_column(%s::regclass, %s::text)",
        [f"{schema}.jobs", value],
    ).fetchone()
    assert row is not None
    return str(row[0])


def _claim(schema: str) -> Callable[[AsyncConn, Tables], Awaitable[list[ClaimedJob]]]:
    return lambda conn, tables: store.claim(conn, schema, "", ["default"], 10, 1, tables)


def test_a_shards_backlog_and_claim_run_on_its_node_as_plain_statements_on_its_tables(
    coordinator: str, citus_schema: str
) -> None:
    queue = CitusQueue(coordinator, schema=citus_schema)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        values = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        homes = [node_of(conn, f"{citus_schema}.jobs", value) for value in values]
        keys = [_shard_key(conn, citus_schema, value) for value in values]
    ids = [queue.enqueue(app.record.job(tenant_id=value, n=0)) for value in values]
    queue.close()

    async def on_node(conn: AsyncConn, tables: Tables) -> tuple[int, str, list[int]]:
        explain = sql.SQL("EXPLAIN ") + store.claim_statement(citus_schema, tables)
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(explain, PARAMS)
            plan = "\n".join(row[0] for row in await cur.fetchall())
        jobs = await _claim(citus_schema)(conn, tables)
        return conn.info.port, plan, [job.id for job in jobs]

    async def run() -> tuple[dict[str, int], list[tuple[int, str, list[int]]]]:
        link = Link(coordinator, "test")
        nodes = Nodes(coordinator, citus_schema, link)
        try:
            backlog = {row.shard: row.queued for row in await nodes.backlog(["default"], 10)}
            return backlog, [await nodes.run(key, on_node) for key in keys]
        finally:
            await nodes.close()
            await link.close()

    backlog, claims = asyncio.run(run())
    assert backlog == {key: 1 for key in keys}
    for (port, plan, claimed), home, job in zip(claims, homes, ids, strict=True):
        assert port == home
        assert "Citus" not in plan and "LockRows" in plan, plan
        assert claimed == [job.id]


def test_a_node_that_cannot_be_reached_fails_its_statements_and_not_the_others(
    coordinator: str, citus_schema: str
) -> None:
    queue = CitusQueue(coordinator, schema=citus_schema)
    with psycopg.connect(coordinator, autocommit=True) as conn:
        first, second = values_on_two_nodes(conn, f"{citus_schema}.jobs")
        keys = [_shard_key(conn, citus_schema, value) for value in (first, second)]
    for value in (first, second):
        queue.enqueue(app.record.job(tenant_id=value, n=0))
    queue.close()

    async def run() -> tuple[str, list[str], list[ClaimedJob]]:
        link = Link(coordinator, "test")
        nodes = Nodes(coordinator, citus_schema, link)
        await nodes.backlog(["default"], 10)
        # As if the cluster knew the first shard's node by a name this host cannot reach.
        unreachable = dataclasses.replace(nodes._placed[keys[0]], port=1)
        for key, shard in list(nodes._placed.items()):
            if shard.port == nodes._placed[keys[0]].port:
                nodes._placed[key] = dataclasses.replace(shard, port=unreachable.port)
        try:
            left = [row.shard for row in await nodes.backlog(["default"], 10)]
            with pytest.raises(psycopg.OperationalError) as failed:
                await nodes.run(keys[0], _claim(citus_schema))
            return str(failed.value), left, await nodes.run(keys[1], _claim(citus_schema))
        finally:
            await nodes.close()
            await link.close()

    failed, left, claimed = asyncio.run(run())
    assert "node 127.0.0.1:1" in failed
    assert left == [keys[1]]  # the unreachable node's shards are left out of the round
    assert len(claimed) == 1


def _scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, depth first."""
    return [plan, *(node for child in plan.get("Plans", []) for node in _scans(child))]


def test_on_a_node_the_claim_and_the_backlog_read_only_the_entries_they_need(
    coordinator: str, citus_schema: str
) -> None:
    """A shard table holds many shard values, which the shard-first indexes order first:
    read through them, a claim of two jobs, or a backlog counted up to two, would walk (and
    sort) every queued job of the table. Queue by queue, each reads a range of the
    per-queue indexes, as many entries as it takes."""
    queue = CitusQueue(coordinator, schema=citus_schema)
    queue.enqueue_many([app.record.job(tenant_id=f"t{n % 40}", n=n) for n in range(400)])
    queue.close()
    with psycopg.connect(coordinator, autocommit=True) as conn:
        key = _shard_key(conn, citus_schema, "t0")

    async def explain(
        conn: AsyncConn, tables: Tables, shard: store.ShardTables
    ) -> list[list[dict[str, Any]]]:
        plans = []
        backlog: dict[str, Any] = {"queues": ["default"], "cap": 2}
        for statement, params in [
            (store.claim_statement(citus_schema, tables), {**PARAMS, "limit": 2}),
            (store.node_backlog_statement(citus_schema, [shard]), backlog),
        ]:
            explained = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement
            async with (
                conn.transaction(force_rollback=True),
                conn.cursor(row_factory=tuple_row) as cur,
            ):
                await cur.execute(explained, params)
                row = await cur.fetchone()
                assert row is not None
                plans.append(_scans(row[0][0]["Plan"]))
        return plans

    async def run() -> list[list[dict[str, Any]]]:
        link = Link(coordinator, "test")
        nodes = Nodes(coordinator, citus_schema, link)
        try:
            await nodes.backlog(["default"], 2)  # where the shards are
            return await nodes.run(key, partial(explain, shard=nodes._placed[key]))
        finally:
            await nodes.close()
            await link.close()

    for plan in asyncio.run(run()):
        assert not any(node["Node Type"] == "Sort" for node in plan), plan
        on_jobs = [node for node in plan if node.get("Relation Name", "").startswith("jobs_")]
        assert on_jobs
        for node in on_jobs:
            assert node["Actual Rows"] * node["Actual Loops"] <= 2, node
