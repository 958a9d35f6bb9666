"""The schema's `migrations` table, and the grants of its roles. Runs sql/queries/migrations.sql
and sql/queries/grant.sql."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import args_row

from pgqueue.errors import ConfigurationError, MigrationError
from pgqueue.queries import Migration, grant, migrations, query
from pgqueue.store.plan import AsyncConn, Plan, SyncConn, fetch, fetch_one, rows_as

GRANTS = {
    "worker": "grant_worker",
    "app": "grant_app",
    "read": "grant_read",
    "operator": "grant_operator",
}


@dataclass(frozen=True)
class TableExists:
    """migration_table_exists's row."""

    exists: bool


@dataclass(frozen=True)
class Applied:
    """A row of migration_applied: the version of a migration applied."""

    version: int


def pending(conn: SyncConn, schema: str) -> list[Migration]:
    """Migrations not yet applied to `schema` (all of them if the schema does not exist)."""
    params = {"schema": schema}
    with conn.cursor(row_factory=args_row(TableExists)) as cur:
        exists = cur.execute(query("migration_table_exists", schema), params).fetchone()
    if exists is None or not exists.exists:
        return list(migrations())
    with conn.cursor(row_factory=args_row(Applied)) as cur:
        return _not_in(cur.execute(query("migration_applied", schema)).fetchall())


async def pending_async(conn: AsyncConn, schema: str) -> list[Migration]:
    """`pending` on an async connection."""
    params = {"schema": schema}
    exists = await fetch_one(conn, TableExists, query("migration_table_exists", schema), params)
    if not exists.exists:
        return list(migrations())
    return _not_in(await fetch(conn, Applied, query("migration_applied", schema)))


def _not_in(applied: list[Applied]) -> list[Migration]:
    versions = {row.version for row in applied}
    return [m for m in migrations() if m.version not in versions]


def apply_plan(schema: str) -> Plan[list[Migration]]:
    """Apply pending migrations in the caller's transaction; those applied (maybe none). The
    advisory lock makes a second process wait, then find nothing to do."""
    yield query("migration_lock", schema), {"schema": schema}
    yield query("migration_table_create", schema), None
    rows = yield query("migration_applied", schema), None
    applied = {row.version for row in rows_as(Applied, rows)}
    done: list[Migration] = []
    for migration in migrations():
        if migration.version in applied:
            continue
        try:
            yield migration.render(schema), None
        except psycopg.Error as exc:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} failed on schema "
                f"{schema!r}: {exc}"
            ) from exc
        record = {"version": migration.version, "name": migration.name}
        yield query("migration_record", schema), record
        done.append(migration)
    return done


def grant_sql(schema: str, role: str, kind: str) -> sql.Composed:
    """What a role of `kind` (worker, app, read, operator) needs on `schema`."""
    if kind not in GRANTS:
        raise ConfigurationError(f"role kind must be one of {', '.join(GRANTS)}, not {kind!r}")
    return grant(GRANTS[kind], schema, role)


def drop_schema(conn: SyncConn, schema: str) -> None:
    """Drop `schema` and everything in it, if it exists; commits on an autocommit `conn`."""
    conn.execute(query("schema_drop", schema))
