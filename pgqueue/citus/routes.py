"""Where a Citus worker runs a shard's statements: on the node that holds the shard, against
the shard's own tables, or through the coordinator, which routes each to that node.

Owns: the placement of each shard value, read from the coordinator's metadata (again after
PLACEMENT_TTL, and at once after a shard was not where it was expected, since a rebalance
moves shards), and one connection per node. On its node a claim is a plain PostgreSQL
statement: no distributed planning, and no hop through the coordinator for each job. A node's
connection tries once: when a node fails, the statement raises and the worker's round goes on
with the other nodes, trying that one again next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

from pgqueue.dsn import redact
from pgqueue.errors import DatabaseError
from pgqueue.queries import Tables
from pgqueue.runtime.link import Link, connect
from pgqueue.store import citus as store
from pgqueue.store.plan import AsyncConn

T = TypeVar("T")
Op = Callable[[AsyncConn, Tables], Awaitable[T]]
log = logging.getLogger("pgqueue.citus")
# Long enough that the metadata read stays off the per-job path; a moved shard is noticed at
# once anyway, by its table missing on the old node.
PLACEMENT_TTL = 30.0
CLAIM_ON = ("nodes", "coordinator")


class Route(Protocol):
    async def locate(self, shards: Sequence[str]) -> None: ...

    async def run(self, shard: str, op: Op[T]) -> T: ...

    async def close(self) -> None: ...


def routes(claim_on: str, dsn: str, schema: str, claims: Link, finish: Link) -> tuple[Route, Route]:
    """Where a worker's claims and its outcomes run: on the nodes, one connection each for
    both, or through the coordinator, on the worker's two links."""
    if claim_on == "nodes":
        nodes = Nodes(dsn, schema, claims)
        return nodes, nodes
    return Coordinator(claims), Coordinator(finish)


class Coordinator:
    """Every shard's statements through the coordinator's connection."""

    def __init__(self, link: Link) -> None:
        self.link = link

    async def locate(self, shards: Sequence[str]) -> None:
        return None

    async def run(self, shard: str, op: Op[T]) -> T:
        return await self.link.run(lambda conn: op(conn, ()))

    async def close(self) -> None:
        return None


class Nodes:
    """Each shard's statements on its own node, found through the coordinator's metadata.
    The node is reached with the coordinator's DSN, its host and port replaced by the name
    the cluster knows the node by."""

    def __init__(self, dsn: str, schema: str, coordinator: Link) -> None:
        self.dsn = dsn
        self.schema = schema
        self.coordinator = coordinator
        self._placed: dict[str, store.Placement] = {}
        self._read_at = float("-inf")
        self._nodes: dict[tuple[str, int], _Node] = {}

    async def locate(self, shards: Sequence[str]) -> None:
        """Know where each of `shards` lives, reading the metadata when it is stale."""
        stale = time.monotonic() - self._read_at > PLACEMENT_TTL
        missing = [shard for shard in shards if shard not in self._placed]
        if not stale and not missing:
            return
        wanted = sorted({*shards, *self._placed}) if stale else missing
        found = await self.coordinator.run(lambda c: store.placements(c, self.schema, wanted))
        if stale:
            self._placed.clear()
            self._read_at = time.monotonic()
        self._placed.update((p.shard, p) for p in found)

    async def run(self, shard: str, op: Op[T]) -> T:
        placement = self._placed.get(shard)
        if placement is None or time.monotonic() - self._read_at > PLACEMENT_TTL:
            await self.locate([shard])
            placement = self._placed.get(shard)
        if placement is None:  # as a node that is down: tried again next round
            raise psycopg.OperationalError(f"no active primary node holds shard {shard!r}")
        node = self._node(placement.host, placement.port)
        try:
            return await node.run(lambda conn: op(conn, placement.tables))
        except psycopg.errors.UndefinedTable:
            log.warning("shard %r is no longer on %s: reading where it went", shard, node.name)
            self._read_at = float("-inf")
            raise

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.close()
        self._nodes.clear()

    def _node(self, host: str, port: int) -> _Node:
        node = self._nodes.get((host, port))
        if node is None:
            dsn = make_conninfo(self.dsn, host=host, port=port)
            node = self._nodes[(host, port)] = _Node(dsn, f"{host}:{port}")
        return node


class _Node:
    """One node's connection, opened when first needed and again after it broke."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.name = name
        self.conn: AsyncConn | None = None
        self._lock = asyncio.Lock()  # a statement, or a transaction, at a time

    async def run(self, op: Callable[[AsyncConn], Awaitable[T]]) -> T:
        async with self._lock:
            if self.conn is None or self.conn.closed:
                self.conn = await _open(self.dsn, self.name)
            try:
                return await op(self.conn)
            except psycopg.OperationalError:
                if self.conn.broken or self.conn.closed:
                    await self.close()
                raise

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


async def _open(dsn: str, name: str) -> AsyncConn:
    """A node's connection; a node that cannot be reached raises psycopg's OperationalError,
    as a statement on a broken connection does, so the worker treats both alike."""
    try:
        return await connect(dsn, name="pgqueue:citus-node")
    except DatabaseError as exc:
        raise psycopg.OperationalError(f"node {name} ({redact(dsn)}): {exc}") from exc
