"""The schema's `migrations` table, and the grants of its roles. Runs sql/queries/migrations.sql
and sql/queries/grant.sql."""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pgqueue.errors import ConfigurationError, MigrationError
from pgqueue.queries import Migration, grant, migrations, query
from pgqueue.store.plan import AsyncConn, Plan, SyncConn, fetch, fetch_one

GRANTS = {
    "worker": "grant_worker",
    "app": "grant_app",
    "read": "grant_read",
    "operator": "grant_operator",
}


def pending(conn: SyncConn, schema: str) -> list[Migration]:
    """Migrations not yet applied to `schema` (all of them if the schema does not exist)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        exists = cur.execute(query("migration_table_exists", schema), {"schema": schema}).fetchone()
        if not exists or not exists[0]:
            return list(migrations())
        applied = {row[0] for row in cur.execute(query("migration_applied", schema))}
    return [m for m in migrations() if m.version not in applied]


async def pending_async(conn: AsyncConn, schema: str) -> list[Migration]:
    """`pending` on an async connection."""
    row = await fetch_one(conn, query("migration_table_exists", schema), {"schema": schema})
    if not row[0]:
        return list(migrations())
    applied = {version for (version,) in await fetch(conn, query("migration_applied", schema))}
    return [m for m in migrations() if m.version not in applied]


def apply_plan(schema: str) -> Plan[list[Migration]]:
    """Apply pending migrations in the caller's transaction; those applied (maybe none). The
    advisory lock makes a second process wait, then find nothing to do."""
    yield query("migration_lock", schema), {"schema": schema}
    yield query("migration_table_create", schema), None
    applied = {row[0] for row in (yield query("migration_applied", schema), None)}
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
