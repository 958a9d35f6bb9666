"""SQLAlchemy 2: enqueue in a `Session`'s (or `AsyncSession`'s, or `Connection`'s) own
transaction.

`queue.enqueue(job, conn=session)` runs pgqueue's statements on the psycopg connection under
the session, inside the transaction the session has open (beginning it, as the session would
on its first statement, when none is). pgqueue never commits, flushes or rolls it back: the
job commits or rolls back with the caller's work, savepoints (`begin_nested()`) included.

Only the psycopg (3) driver gives pgqueue a connection it can use: `postgresql+psycopg://`
URLs, or plain `postgresql://` where psycopg is the installed driver. Other drivers are
refused with a message that says so.

Its `ADAPTER` is a connection adapter (pgqueue/hooks.py), registered when this module is
imported; pgqueue's package metadata declares it under the entry point group
`pgqueue.connection_adapters`, so that the first SQLAlchemy object passed as `conn=` loads it
without the application importing it. The core imports neither this module nor SQLAlchemy.
"""

from __future__ import annotations

from typing import Any, TypeVar

import psycopg
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from pgqueue import hooks
from pgqueue.errors import ConfigurationError

D = TypeVar("D")
SYNC_KINDS = (Session, Connection)


def sync_connection(conn: object) -> psycopg.Connection[Any]:
    """The psycopg connection under a Session or Connection, in its open transaction."""
    # By module: the asyncio extension needs greenlet, which a sync application may lack.
    if type(conn).__module__.startswith("sqlalchemy.ext.asyncio"):
        raise ConfigurationError(
            f"a {type(conn).__name__} goes with AsyncQueue; Queue takes a Session or Connection"
        )
    if isinstance(conn, Session):
        connection = conn.connection()  # begins the session's transaction, flushes nothing
    elif isinstance(conn, Connection):
        connection = conn
        if not connection.in_transaction():
            connection.begin()  # what its next statement would do (commit as you go)
    else:
        raise ConfigurationError(
            f"Queue takes a psycopg Connection, or a SQLAlchemy Session or Connection; "
            f"got {type(conn).__name__}"
        )
    return _driver_of(
        connection.connection.driver_connection, connection.dialect, psycopg.Connection
    )


async def async_connection(conn: object) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under an AsyncSession or AsyncConnection, in its open
    transaction."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(conn, AsyncSession):
        connection = await conn.connection()
    elif isinstance(conn, AsyncConnection):
        connection = conn
        if not connection.in_transaction():
            await connection.begin()
    elif isinstance(conn, SYNC_KINDS):
        raise ConfigurationError(
            f"a {type(conn).__name__} goes with Queue; AsyncQueue takes an AsyncSession or "
            "AsyncConnection"
        )
    else:
        raise ConfigurationError(
            f"AsyncQueue takes a psycopg AsyncConnection, or a SQLAlchemy AsyncSession or "
            f"AsyncConnection; got {type(conn).__name__}"
        )
    raw = await connection.get_raw_connection()
    return _driver_of(raw.driver_connection, connection.dialect, psycopg.AsyncConnection)


def _driver_of(driver: object, dialect: Any, kind: type[D]) -> D:
    if not isinstance(driver, kind):
        name = f"{dialect.name}+{dialect.driver}"
        raise ConfigurationError(
            f"pgqueue runs on the psycopg (3) driver, and this engine uses {name}: create it "
            "with a postgresql+psycopg:// URL (create_async_engine takes the same URL) so "
            "that jobs join its transactions"
        )
    return driver


class SQLAlchemyAdapter:
    """The connection adapter (pgqueue.hooks.ConnectionAdapter) for SQLAlchemy's objects."""

    library = "sqlalchemy"

    def connection(self, conn: object) -> psycopg.Connection[Any]:
        return sync_connection(conn)

    async def async_connection(self, conn: object) -> psycopg.AsyncConnection[Any]:
        return await async_connection(conn)


ADAPTER = SQLAlchemyAdapter()
hooks.register(ADAPTER)
