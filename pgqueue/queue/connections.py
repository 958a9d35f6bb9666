"""The client's connections: the caller's (a psycopg connection, or another library's object
through its adapter), checked before a statement runs on it, and the twins' own.

Guarantees: a closed connection, one whose transaction an earlier error aborted, or an object
of the wrong kind fails before any statement, with a message that says what to pass instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pgqueue import hooks
from pgqueue.dsn import redact
from pgqueue.errors import (
    ConfigurationError,
    DatabaseError,
)


def _alone(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a statement on `conn` is a transaction of its own (autocommit, no block open)."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _require(conn: object, kind: type, method: str) -> None:
    if not isinstance(conn, kind):
        raise _wrong_connection(conn, kind, method)


def _adapter(conn: object, kind: type, method: str) -> hooks.ConnectionAdapter:
    """The adapter that gives the psycopg connection under `conn`, another library's
    connection object (a SQLAlchemy Session, through pgqueue/contrib/sqlalchemy.py)."""
    adapter = hooks.adapter_for(conn)
    if adapter is None:
        raise _wrong_connection(conn, kind, method)
    return adapter


def _wrong_connection(conn: object, kind: type, method: str) -> TypeError:
    return TypeError(
        f"{method} needs a {kind.__module__}.{kind.__name__}, got {type(conn).__name__}"
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection of the queue's own; fails fast and clearly on a malformed DSN or an
    unreachable server, before a pool would retry in the background until its timeout."""
    _check_dsn(dsn)
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unreachable(dsn, exc) from None


async def _connect_async(dsn: str, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
    """`_connect` for the async twin, without blocking the event loop."""
    _check_dsn(dsn)
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unreachable(dsn, exc) from None


def _check_dsn(dsn: str) -> None:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid DSN: {exc}") from None


def _unreachable(dsn: str, exc: psycopg.Error) -> DatabaseError:
    return DatabaseError(f"cannot connect to {redact(dsn)}: {exc}".strip())


def _usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Refuse a connection no statement can run on, before trying one."""
    if conn.closed:
        raise DatabaseError("the connection passed as conn= is closed: pass an open one")
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        raise DatabaseError(
            "the transaction of the connection passed as conn= was aborted by an earlier "
            "error: roll it back (conn.rollback()) before using it again"
        )
