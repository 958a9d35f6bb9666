"""The PostgreSQL server a suite measures, and the scratch space it measures in.

Without a DSN a suite starts the embedded PostgreSQL in a temporary folder and stops it at
the end. Every suite records the same description of the server beside its figures: the
version, whether it was the embedded one, and the settings that move the numbers.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

# Settings that change what a bench measures; recorded with every result.
SETTINGS = ("shared_buffers", "fsync", "synchronous_commit", "max_connections")


@dataclass(frozen=True)
class Server:
    dsn: str
    embedded: bool
    version: str
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The results folder's name for this server: pg15, pg18."""
        return f"pg{self.version.split('.')[0]}"

    def describe(self) -> dict[str, object]:
        return {
            "embedded": self.embedded,
            "server_version": self.version,
            "settings": self.settings,
        }


@contextlib.contextmanager
def database(dsn: str | None, *, configure: dict[str, str] | None = None) -> Iterator[Server]:
    """The server at `dsn`, or an embedded one started here and stopped after. `configure`
    sets server settings on the embedded one (ALTER SYSTEM, then a restart, so settings that
    need one, such as shared_preload_libraries, take effect); a server at `dsn` is used as
    it is, and its settings are recorded."""
    if dsn:
        yield _described(dsn, embedded=False, extra=tuple(configure or ()))
        return
    from pgqueue import embedded

    with tempfile.TemporaryDirectory(prefix="pgqueue-bench-") as tmp:
        print(
            f"bench: no --dsn and no PGQUEUE_DSN: starting the embedded PostgreSQL in {tmp}",
            file=sys.stderr,
        )
        started = embedded.start(Path(tmp) / "data")
        try:
            if configure:
                _configure(started.dsn, configure)
                started.restart()
            yield _described(started.dsn, embedded=True, extra=tuple(configure or ()))
        finally:
            started.stop()


def _configure(dsn: str, settings: dict[str, str]) -> None:
    with psycopg.connect(dsn, autocommit=True, application_name="bench") as conn:
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )


def _described(dsn: str, *, embedded: bool, extra: tuple[str, ...] = ()) -> Server:
    with psycopg.connect(dsn, autocommit=True, application_name="bench") as conn:
        row = conn.execute("SHOW server_version").fetchone()
        settings = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings"
            " WHERE name LIKE 'autovacuum%%' OR name = ANY(%s) ORDER BY name",
            [[*SETTINGS, *extra]],
        ).fetchall()
    version = str(row[0]).split()[0] if row else "unknown"
    return Server(dsn, embedded, version, {str(k): str(v) for k, v in settings})


@contextlib.contextmanager
def scratch_database(server_dsn: str, prefix: str) -> Iterator[str]:
    """A database of the suite's own on the server, dropped at the end whatever happened."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server_dsn)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo("", **info)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def scratch_schema(dsn: str, prefix: str, *, partitions: bool = True) -> Iterator[str]:
    """A migrated pgqueue schema of the suite's own, dropped at the end whatever happened.
    Without `partitions`, migrated inside a transaction, which leaves the history's daily
    partitions to workers: until one runs, all history sits in the one default partition."""
    from pgqueue.migrate import apply

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if partitions:
            apply(conn, name)
        else:
            with conn.transaction():
                apply(conn, name)
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
