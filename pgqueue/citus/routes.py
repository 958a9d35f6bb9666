"""Where a Citus worker finds its work and runs a shard's statements: on the nodes, shard table
by shard table, or through the coordinator, shard value by shard value.

Owns: on the nodes, the shards of the jobs table and the node that holds each, read from the
coordinator's metadata (again after PLACEMENT_TTL, and at once after a shard was not where it
was expected, since a rebalance moves shards), and one connection per node. There a shard's
table holds many shard values: its backlog is read and its jobs claimed all together, in
batches, by plain PostgreSQL statements on the shard's own tables, with no distributed
planning and nothing sent through the coordinator. A node's connection tries once: when a
node fails, its statements raise (its backlog is left out of the round, logged once) and
the worker goes on with the other nodes, trying that one again next round.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
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
# A write to one shard, in a transaction that may write others: (connection, shard, tables).
ShardWrite = Callable[[AsyncConn, str, Tables], Awaitable[object]]
log = logging.getLogger("pgqueue.citus")
# Long enough that the metadata read stays off the per-job path; a moved shard is noticed at
# once anyway, by its table missing on the old node.
PLACEMENT_TTL = 30.0
CLAIM_ON = ("nodes", "coordinator")


class Route(Protocol):
    async def backlog(self, queues: Sequence[str], free: int) -> list[store.Backlog]:
        """Each shard with work: the key `run` takes, its queued and due jobs (on the nodes
        counted up to `free`, the slots they share: a shard takes at most that many)."""
        ...

    async def run(self, shard: str, op: Op[T]) -> T: ...

    def together(self, shards: Sequence[str]) -> list[list[str]]:
        """`shards` in groups that one transaction can write without two-phase commit."""
        ...

    async def write(self, group: Sequence[str], op: ShardWrite) -> None:
        """`op` for each shard of a group from `together`, in one transaction."""
        ...

    async def close(self) -> None: ...


def routes(claim_on: str, dsn: str, schema: str, claims: Link, finish: Link) -> tuple[Route, Route]:
    """Where a worker's claims and its outcomes run: on the nodes, one connection each for
    both, or through the coordinator, on the worker's two links."""
    if claim_on == "nodes":
        nodes = Nodes(dsn, schema, claims)
        return nodes, nodes
    return Coordinator(schema, claims), Coordinator(schema, finish)


class Coordinator:
    """Every statement through the coordinator's connection, one shard value at a time."""

    def __init__(self, schema: str, link: Link) -> None:
        self.schema = schema
        self.link = link

    async def backlog(self, queues: Sequence[str], free: int) -> list[store.Backlog]:
        return await self.link.run(lambda conn: store.backlog(conn, self.schema, queues))

    async def run(self, shard: str, op: Op[T]) -> T:
        return await self.link.run(lambda conn: op(conn, ()))

    def together(self, shards: Sequence[str]) -> list[list[str]]:
        # Two shard values may live on two nodes: one transaction each.
        return [[shard] for shard in shards]

    async def write(self, group: Sequence[str], op: ShardWrite) -> None:
        async def each(conn: AsyncConn) -> None:
            async with conn.transaction():
                for shard in group:
                    await op(conn, shard, ())

        await self.link.run(each)

    async def close(self) -> None:
        return None


class Nodes:
    """Each shard's statements on the node that holds it, found through the coordinator's
    metadata. A node is reached with the coordinator's DSN, its host and port replaced by
    the name the cluster knows the node by."""

    def __init__(self, dsn: str, schema: str, coordinator: Link) -> None:
        self.dsn = dsn
        self.schema = schema
        self.coordinator = coordinator
        self._placed: dict[str, store.ShardTables] = {}
        self._read_at = float("-inf")
        self._nodes: dict[tuple[str, int], _Node] = {}

    async def backlog(self, queues: Sequence[str], free: int) -> list[store.Backlog]:
        """Every shard with work (or a job scheduled), one statement a node; a node that
        fails is left out."""
        await self._locate()
        by_node: dict[tuple[str, int], list[store.ShardTables]] = defaultdict(list)
        for shard in self._placed.values():
            by_node[(shard.host, shard.port)].append(shard)
        found: list[store.Backlog] = []
        for (host, port), shards in by_node.items():
            node = self._node(host, port)

            async def read(
                conn: AsyncConn, shards: list[store.ShardTables] = shards
            ) -> list[store.Backlog]:
                return await store.node_backlog(conn, self.schema, shards, queues, free)

            try:
                rows = await node.run(read)
                found += [r for r in rows if r.queued or r.due or r.next_due_in is not None]
            except psycopg.errors.UndefinedTable:
                self._moved(node)
            except psycopg.OperationalError as exc:
                node.failed(exc)
        return found

    async def run(self, shard: str, op: Op[T]) -> T:
        placed = self._placed.get(shard)
        if placed is None:
            await self._locate(force=True)
            placed = self._placed.get(shard)
        if placed is None:  # split or dropped: as a node that is down, tried again later
            raise psycopg.OperationalError(f"shard {shard} is not in the cluster's metadata")
        node = self._node(placed.host, placed.port)
        try:
            return await node.run(lambda conn: op(conn, placed.tables))
        except psycopg.errors.UndefinedTable:
            self._moved(node)
            raise

    def together(self, shards: Sequence[str]) -> list[list[str]]:
        """The shards of each node in one group; one whose place is not known, alone."""
        groups: dict[object, list[str]] = defaultdict(list)
        for shard in shards:
            placed = self._placed.get(shard)
            groups[shard if placed is None else (placed.host, placed.port)].append(shard)
        return list(groups.values())

    async def write(self, group: Sequence[str], op: ShardWrite) -> None:
        if any(shard not in self._placed for shard in group):
            await self._locate(force=True)
        placed = [self._placed[shard] for shard in group if shard in self._placed]
        homes = {(shard.host, shard.port) for shard in placed}
        if len(placed) != len(group) or len(homes) != 1:  # split, dropped or moved: retried
            raise psycopg.OperationalError(f"shards {list(group)} are not on one node")
        node = self._node(*homes.pop())

        async def each(conn: AsyncConn) -> None:
            async with conn.transaction():
                for shard, where in zip(group, placed, strict=True):
                    await op(conn, shard, where.tables)

        try:
            await node.run(each)
        except psycopg.errors.UndefinedTable:
            self._moved(node)
            raise

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.close()
        self._nodes.clear()

    async def _locate(self, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._read_at <= PLACEMENT_TTL:
            return
        found = await self.coordinator.run(lambda c: store.shard_tables(c, self.schema))
        self._placed = {shard.key: shard for shard in found}
        self._read_at = time.monotonic()

    def _moved(self, node: _Node) -> None:
        log.warning("a shard is no longer on %s: reading where the shards are", node.name)
        self._read_at = float("-inf")

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
        self.down = False  # its last statement failed: logged once until one succeeds
        self._lock = asyncio.Lock()  # a statement, or a transaction, at a time

    async def run(self, op: Callable[[AsyncConn], Awaitable[T]]) -> T:
        async with self._lock:
            if self.conn is None or self.conn.closed:
                self.conn = await _open(self.dsn, self.name)
            try:
                result = await op(self.conn)
            except psycopg.OperationalError:
                if self.conn.broken or self.conn.closed:
                    await self.close()
                raise
        if self.down:
            self.down = False
            log.warning("node %s is back", self.name)
        return result

    def failed(self, exc: BaseException) -> None:
        if not self.down:
            self.down = True
            log.warning("node %s failed, its shards wait until it is back: %s", self.name, exc)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


async def _open(dsn: str, name: str) -> AsyncConn:
    """A node's connection; a node that cannot be reached raises psycopg's OperationalError,
    as a statement on a broken connection does, so the worker treats both alike."""
    try:
        conn = await connect(dsn, name="pgqueue:citus-node")
    except DatabaseError as exc:
        raise psycopg.OperationalError(f"node {name} ({redact(dsn)}): {exc}") from exc
    # The statements here are prepared, and their plans depend on no parameter: each names
    # its indexes' order. Planned once, not at every round (the backlog's union of every
    # shard of the node costs far more to plan than to run).
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    return conn
