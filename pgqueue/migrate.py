"""Apply, list and print the numbered, up-only migrations in sql/migrations.

Owns: the schema's `migrations` table. All pending migrations apply in one transaction under
an advisory lock, so applying twice is a no-op and two processes migrating at once are safe
(the second waits, then finds nothing to do). A failing migration rolls everything back and
raises MigrationError. And the history partitions' upkeep that follows each migrate, which
the workers' HistoryPartitions (history/partitions.py) repeat every hour.
"""

from __future__ import annotations

import logging

from psycopg.pq import TransactionStatus

from pgqueue.queries import Migration, migrations
from pgqueue.store.history import partitions_step_plan
from pgqueue.store.migrations import apply_plan, grant_sql, pending
from pgqueue.store.plan import AsyncConn, SyncConn, run, run_async

__all__ = [
    "apply",
    "apply_async",
    "grant_role",
    "grant_sql",
    "is_migrated",
    "pending",
    "render",
    "upkeep",
    "upkeep_async",
]


def apply(conn: SyncConn, schema: str) -> list[Migration]:
    """Apply pending migrations in one transaction; returns those applied (maybe none).
    Then, on an autocommit connection, the history partitions' upkeep (`upkeep`, below), each
    step its own transaction, so that a new schema keeps history by day from its first job
    (inside a caller's transaction, the workers do it).

    `conn` must not be inside a transaction: this commits.
    """
    with conn.transaction():
        applied = run(conn, apply_plan(schema), together=False)
    if _own_transactions(conn):
        upkeep(conn, schema)
    return applied


async def apply_async(conn: AsyncConn, schema: str) -> list[Migration]:
    """`apply` on an async connection."""
    async with conn.transaction():
        applied = await run_async(conn, apply_plan(schema), together=False)
    if _own_transactions(conn):
        await upkeep_async(conn, schema)
    return applied


def _own_transactions(conn: SyncConn | AsyncConn) -> bool:
    """Whether each statement on `conn` now commits on its own (autocommit, no transaction
    of the caller's open)."""
    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def render(schema: str, selected: list[Migration] | None = None) -> str:
    """The SQL of the given migrations (default: all) for `schema`, as text to review."""
    parts = []
    for migration in selected if selected is not None else migrations():
        text = migration.render(schema).as_string(None)
        parts.append(f"-- migration {migration.version:04d}_{migration.name}\n{text.strip()}\n")
    return "\n".join(parts)


def is_migrated(conn: SyncConn, schema: str) -> bool:
    return not pending(conn, schema)


def grant_role(conn: SyncConn, schema: str, role: str, kind: str) -> None:
    """Grant `role` what a worker (`kind="worker"`), an enqueueing app (`"app"`), a read-only
    dashboard (`"read"`) or the dashboard's actions (`"operator"`) need on `schema`, and
    nothing else. The role must exist; run after migrating. Commits."""
    with conn.transaction():
        conn.execute(grant_sql(schema, role, kind))


# -- the history's partitions, made ahead by each migrate and by the workers
# (history/partitions.py) --------------------------------------------------------------------

log = logging.getLogger("pgqueue.retention")
AHEAD_DAYS = 3
LOCK_MS = 500
MAX_STEPS = 4 + AHEAD_DAYS  # the upgrade's steps and a partition a day, with room to spare


def upkeep(conn: SyncConn, schema: str) -> list[str]:
    """Run upkeep steps on `conn` (autocommit, each step its own transaction) until none is
    left to do; what they did."""
    done: list[str] = []
    for _ in range(MAX_STEPS):
        step = run(conn, partitions_step_plan(schema, AHEAD_DAYS, LOCK_MS), together=False)
        if step is None:
            break
        log.info("history partitions: %s", step)
        done.append(step)
    return done


async def upkeep_async(conn: AsyncConn, schema: str) -> list[str]:
    """`upkeep` on an async connection."""
    done: list[str] = []
    for _ in range(MAX_STEPS):
        plan = partitions_step_plan(schema, AHEAD_DAYS, LOCK_MS)
        step = await run_async(conn, plan, together=False)
        if step is None:
            break
        log.info("history partitions: %s", step)
        done.append(step)
    return done
