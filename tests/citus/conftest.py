"""Fixtures of the Citus suite: one local cluster per session (bench/citus/cluster.py), a
schema laid out with `migrate --citus` per test. Skips, saying why, where Citus is not installed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.citus import cluster
from pgqueue.citus import CitusQueue
from tests.citus import app


@pytest.fixture(scope="session")
def citus() -> Iterator[cluster.Cluster]:
    why = cluster.installed()
    if why:
        pytest.skip(f"Citus is not available: {why}")
    with cluster.running(nodes=2) as running:
        yield running


@pytest.fixture
def coordinator(citus: cluster.Cluster) -> str:
    return citus.coordinator


@pytest.fixture
def citus_schema(coordinator: str) -> Iterator[str]:
    """A schema migrated and laid out with `migrate --citus`, dropped afterwards."""
    name = f"pgq_citus_{uuid.uuid4().hex[:10]}"
    CitusQueue(coordinator, schema=name).migrate()
    yield name
    with psycopg.connect(coordinator, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def queue(
    coordinator: str, citus_schema: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CitusQueue]:
    """The schema's queue; the app's tasks (tests/citus/app.py), run in this process, write
    to its runs table."""
    with psycopg.connect(coordinator, autocommit=True) as conn:
        app.runs_table(conn, citus_schema)
    monkeypatch.setenv("CITUS_APP_DSN", coordinator)
    monkeypatch.setenv("CITUS_APP_SCHEMA", citus_schema)
    q = CitusQueue(coordinator, schema=citus_schema)
    yield q
    q.close()


def node_of(conn: psycopg.Connection[Any], table: str, value: str) -> int:
    """The port of the node holding `value`'s shard of the distributed `table`."""
    row = conn.execute(
        "SELECT p.nodeport FROM pg_dist_shard_placement AS p "
        "WHERE p.shardid = get_shard_id_for_distribution_column(%s::regclass, %s::text)",
        [table, value],
    ).fetchone()
    assert row is not None
    return int(row[0])


def values_on_two_nodes(conn: psycopg.Connection[Any], table: str) -> tuple[str, str]:
    """Two shard values whose shards are on different nodes."""
    first = "tenant-0"
    home = node_of(conn, table, first)
    for i in range(1, 200):
        value = f"tenant-{i}"
        if node_of(conn, table, value) != home:
            return first, value
    raise AssertionError("every value landed on one node")
