"""A worker's database connection that comes back after faults.

Owns: one autocommit AsyncConnection, reopened with capped exponential backoff when the server
restarts or the backend is terminated. An outage is logged once when it starts and once when
it ends, never once per job. A bad DSN at start raises DatabaseError at once instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from pgqueue.dsn import redact
from pgqueue.errors import DatabaseError
from pgqueue.runtime.service import Health
from pgqueue.store.plan import AsyncConn

log = logging.getLogger("pgqueue.worker")
T = TypeVar("T")
_BACKOFF_MAX = 5.0


async def connect(dsn: str, *, prepare: bool = True, name: str = "pgqueue") -> AsyncConn:
    """Open an autocommit connection; a bad DSN or unreachable server is a DatabaseError.

    `name` becomes application_name, so operators can tell pgqueue's sessions apart.
    """
    try:
        return await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            prepare_threshold=5 if prepare else None,
            application_name=name,
        )
    except psycopg.Error as exc:
        raise DatabaseError(f"cannot connect to the database ({redact(dsn)}): {exc}") from exc


class Link:
    """Runs operations on a connection, reconnecting while the database is away.

    Operations run one at a time, each to its end: an operation may open a transaction and
    issue several statements without another coroutine's statement landing inside it
    (tests/integration/test_rescue.py::test_a_slow_but_alive_worker_keeps_its_jobs_past_the_lease
    caught a claim committed late inside the rescuer's transaction before this lock existed).
    """

    def __init__(
        self,
        dsn: str,
        name: str,
        *,
        prepare: bool = True,
        on_connect: Callable[[AsyncConn], Awaitable[None]] | None = None,
        on_reconnect: Callable[[AsyncConn], Awaitable[None]] | None = None,
    ) -> None:
        """`on_connect` runs on every new connection (session settings), `on_reconnect` on
        each one that ends an outage."""
        self.dsn = dsn
        self.name = name
        self.prepare = prepare
        self.on_connect = on_connect
        self.on_reconnect = on_reconnect
        self.conn: AsyncConn | None = None
        self._outage = False
        self._lock = asyncio.Lock()

    @property
    def app_name(self) -> str:
        return f"pgqueue:{self.name}"

    async def open(self) -> None:
        self.conn = await self._connect()

    async def start(self) -> None:
        """As a worker's service: connect now, so a bad DSN fails the start."""
        await self.open()

    async def stop(self, deadline: float) -> None:
        await self.close()

    def health(self) -> Health:
        return Health(False, "reconnecting") if self._outage else Health(True)

    async def _connect(self) -> AsyncConn:
        conn = await connect(self.dsn, prepare=self.prepare, name=self.app_name)
        if self.on_connect is not None:
            try:
                await self.on_connect(conn)
            except BaseException:
                await conn.close()
                raise
        return conn

    async def run(self, op: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """Run op alone on the connection until it succeeds, reconnecting between tries.
        Errors from SQL itself (not from the connection) are raised to the caller."""
        async with self._lock:
            return await self._run(op)

    async def _run(self, op: Callable[[AsyncConn], Awaitable[T]]) -> T:
        delay = 0.05
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = await self._connect()
                    if self._outage and self.on_reconnect is not None:
                        await self.on_reconnect(self.conn)
                result = await op(self.conn)
            except (psycopg.OperationalError, DatabaseError) as exc:
                if (
                    self.conn is not None
                    and not self.conn.closed
                    and not _is_connection_fault(self.conn)
                ):
                    raise
                self._enter_outage(exc)
                await self._discard()
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
                continue
            if self._outage:
                self._outage = False
                log.warning("%s connection is back", self.name)
            return result

    async def close(self) -> None:
        await self._discard()

    def _enter_outage(self, exc: BaseException) -> None:
        if not self._outage:
            self._outage = True
            log.error("%s connection lost, reconnecting with backoff: %s", self.name, exc)

    async def _discard(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            with contextlib.suppress(Exception):
                await conn.close()


def _is_connection_fault(conn: AsyncConn) -> bool:
    return conn.broken or conn.closed
