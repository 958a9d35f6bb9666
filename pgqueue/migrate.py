"""Apply, list and print the numbered, up-only migrations in sql/migrations.

Owns: the schema's `migrations` table. All pending migrations apply in one transaction under
an advisory lock, so applying twice is a no-op and two processes migrating at once are safe
(the second waits, then finds nothing to do). A failing migration rolls everything back and
raises MigrationError.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgqueue import records
from pgqueue.errors import ConfigurationError, MigrationError
from pgqueue.queries import Migration, grant, migrations, query


def pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Migrations not yet applied to `schema` (all of them if the schema does not exist)."""
    exists = conn.execute(query("migration_table_exists", schema), {"schema": schema}).fetchone()
    if not exists or not exists[0]:
        return list(migrations())
    applied = {row[0] for row in conn.execute(query("migration_applied", schema))}
    return [m for m in migrations() if m.version not in applied]


def apply(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Apply pending migrations in one transaction; returns those applied (maybe none).

    `conn` must not be inside a transaction: this commits.
    """
    with conn.transaction():
        return records.run(conn, _apply_plan(schema), together=False)


async def apply_async(conn: psycopg.AsyncConnection[Any], schema: str) -> list[Migration]:
    """`apply` on an async connection."""
    async with conn.transaction():
        return await records.run_async(conn, _apply_plan(schema), together=False)


def _apply_plan(schema: str) -> records.Plan[list[Migration]]:
    """The statements of `apply`, for either twin to drive. The advisory lock makes a second
    process wait, then find nothing to do."""
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


def render(schema: str, selected: list[Migration] | None = None) -> str:
    """The SQL of the given migrations (default: all) for `schema`, as text to review."""
    parts = []
    for migration in selected if selected is not None else migrations():
        text = migration.render(schema).as_string(None)
        parts.append(f"-- migration {migration.version:04d}_{migration.name}\n{text.strip()}\n")
    return "\n".join(parts)


def is_migrated(conn: psycopg.Connection[Any], schema: str) -> bool:
    return not pending(conn, schema)


ROLE_KINDS = ("worker", "app")


def grant_role(conn: psycopg.Connection[Any], schema: str, role: str, kind: str) -> None:
    """Grant `role` what a worker (`kind="worker"`) or an enqueueing app (`"app"`) needs on
    `schema`, and nothing else. The role must exist; run after migrating. Commits."""
    with conn.transaction():
        conn.execute(grant_sql(schema, role, kind))


def grant_sql(schema: str, role: str, kind: str) -> sql.Composed:
    if kind not in ROLE_KINDS:
        raise ConfigurationError(f"role kind must be one of {', '.join(ROLE_KINDS)}, not {kind!r}")
    return grant(f"grant_{kind}", schema, role)
