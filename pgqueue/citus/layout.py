"""`pgqueue migrate --citus`: pgqueue's migrations, then the Citus layout, on the coordinator.

Owns: the order of the two. The migrations run as on plain PostgreSQL (the same SQL); the
layout (sql/queries/citus.sql, citus_lay_out) then distributes the jobs and their history by
their shard column, colocated, and makes the definition tables reference tables, in one
transaction of its own: a failure leaves the schema migrated and not laid out, and the next
run lays it out. Laid out once, a schema is not laid out again.
"""

from __future__ import annotations

from pgqueue import migrate as migrations
from pgqueue.errors import CitusUnsupportedError
from pgqueue.queries import Migration
from pgqueue.store import citus as store
from pgqueue.store.migrations import apply_plan
from pgqueue.store.plan import SyncConn, run


def migrate(conn: SyncConn, schema: str) -> list[Migration]:
    """Apply pending migrations to `schema` and lay it out for the cluster; the migrations
    applied. `conn` is an autocommit connection to the coordinator, outside a transaction."""
    if store.version(conn) is None:
        raise CitusUnsupportedError(
            "this database has no citus extension: run `pgqueue migrate --citus` on a Citus "
            "coordinator (CREATE EXTENSION citus), or `pgqueue migrate` without --citus"
        )
    if store.laid_out(conn, schema):
        # No history partition upkeep here: on a laid-out schema its partitions are the
        # cluster's (the docs' table says what that leaves out).
        with conn.transaction():
            return run(conn, apply_plan(schema), together=False)
    applied = migrations.apply(conn, schema)
    with conn.transaction():
        store.lay_out(conn, schema)
    return applied


def is_laid_out(conn: SyncConn, schema: str) -> bool:
    """Whether `schema` on this database is laid out for Citus."""
    return store.version(conn) is not None and store.laid_out(conn, schema)
