"""What the operator's reports read: queue counts, the sessions that hold back the xmin
horizon, and VACUUM's statistics of the jobs table; and the guarded kill of a holder. Runs
sql/queries/health.sql. Nothing here writes to pgqueue's tables."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from psycopg.rows import args_row, class_row
from pydantic import BaseModel, ConfigDict

from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, SyncConn

# The horizon statements read only cluster views and render no {schema}: any valid name will do.
_NO_SCHEMA = "pgqueue"
_JOBS_TABLE = "jobs"


class Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


HolderKind = Literal["session", "replication_slot", "prepared_xact"]


class _Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QueueStats(Report):
    """One queue: live jobs now, and what finished in the hour up to `now`."""

    queue: str
    queued: int
    scheduled: int
    running: int
    waiting: int  # parked: their concurrency key is at its limit
    failed_last_hour: int
    succeeded_last_minute: int
    succeeded_last_hour: int
    oldest_queued_age: timedelta | None  # None when nothing is queued
    paused: bool = False  # its workers claim none of its jobs until it is resumed
    blocked: int = 0  # workflow jobs waiting for the jobs they depend on


class HorizonHolder(Report):
    """Something that keeps VACUUM from removing rows that died after its oldest xid.

    session: a backend with a snapshot or a transaction id (pid, state, query).
    replication_slot: `name` is the slot, `backend_type` physical or logical, `pid` its walsender
    if active; a slot has no start time, so `age` is None. catalog_xmin holds catalogs only.
    prepared_xact: `name` is the gid, `xact_start` when it was prepared; it has no pid.
    xmin_age and catalog_xmin_age count transactions, not time.
    """

    kind: HolderKind
    pid: int | None
    name: str | None
    usename: str | None
    application_name: str | None
    backend_type: str | None
    state: str | None
    xact_start: datetime | None
    age: timedelta | None
    state_age: timedelta | None
    query: str | None
    xmin_age: int | None
    catalog_xmin_age: int | None
    terminable: bool  # what `terminate` would accept, were it old enough

    @property
    def key(self) -> tuple[str, int | None, str | None, datetime | None]:
        """The same holder across two reads: its transaction, not just its pid."""
        return (self.kind, self.pid, self.name, self.xact_start)


class TableHealth(Report):
    """VACUUM's view of one table; the counts are the statistics system's estimates."""

    schema_name: str
    table_name: str
    n_live_tup: int
    n_dead_tup: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_autoanalyze: datetime | None


class QueueActivity(Report):
    """One queue as the dashboard shows it: live jobs now, and what history's index finds
    in short ranges (successes in the last minute, failures in the last hour)."""

    queue: str
    queued: int
    scheduled: int
    running: int
    waiting: int
    blocked: int
    succeeded_last_minute: int
    failed_last_hour: int
    oldest_queued_age: timedelta | None
    paused: bool


def queue_activity(conn: SyncConn, schema: str, now: datetime | None = None) -> list[QueueActivity]:
    """Each queue with live jobs, a worker or a pause; raises UndefinedTable if never
    migrated. Read with JIT off for its transaction (health.sql, transaction_without_jit)."""
    with conn.transaction(), conn.cursor(row_factory=class_row(QueueActivity)) as cur:
        cur.execute(query("transaction_without_jit", schema))
        return cur.execute(query("queue_read_activity", schema), {"now": now}).fetchall()


class QueueDepth(Report):
    """Live jobs of one queue in one status; `oldest_queued_seconds` only for `queued`,
    `waiting_for_signal` and `sleeping` only for `scheduled`."""

    queue: str
    status: str
    jobs: int
    oldest_queued_seconds: float | None
    waiting_for_signal: int = 0  # of the scheduled: parked for a signal (ctx.wait_for_signal)
    sleeping: int = 0  # of the scheduled: asleep (ctx.sleep)


def queue_depth(conn: SyncConn, schema: str, now: datetime | None = None) -> list[QueueDepth]:
    """Live jobs per queue and status, from the hot table alone; raises UndefinedTable if
    never migrated."""
    with conn.cursor(row_factory=class_row(QueueDepth)) as cur:
        return cur.execute(query("queue_read_depth", schema), {"now": now}).fetchall()


def queue_stats(conn: SyncConn, schema: str, now: datetime | None) -> list[QueueStats]:
    """Per-queue counts, ordered by queue name; raises UndefinedTable if never migrated."""
    with conn.cursor(row_factory=class_row(QueueStats)) as cur:
        return cur.execute(query("queue_list_stats", schema), {"now": now}).fetchall()


def horizon_holders(
    conn: SyncConn, min_age: timedelta | None, now: datetime | None
) -> list[HorizonHolder]:
    """Holders of the horizon, oldest xid first, never the calling connection."""
    params = {"min_age": min_age, "now": now}
    with conn.cursor(row_factory=class_row(HorizonHolder)) as cur:
        return cur.execute(query("horizon_list_holders", _NO_SCHEMA), params).fetchall()


async def horizon_holders_async(
    conn: AsyncConn, min_age: timedelta | None, now: datetime | None = None
) -> list[HorizonHolder]:
    """`horizon_holders` on an async connection."""
    params = {"min_age": min_age, "now": now}
    async with conn.cursor(row_factory=class_row(HorizonHolder)) as cur:
        await cur.execute(query("horizon_list_holders", _NO_SCHEMA), params)
        return await cur.fetchall()


def jobs_table_health(conn: SyncConn, schema: str) -> TableHealth | None:
    """VACUUM's view of `schema`.jobs; None if there is no such table."""
    params = {"schema": schema, "table": _JOBS_TABLE}
    with conn.cursor(row_factory=class_row(TableHealth)) as cur:
        return cur.execute(query("table_read_health", schema), params).fetchone()


@dataclass(frozen=True)
class Terminated:
    """session_terminate_holder's row: whether the holder exited in time."""

    terminated: bool


def terminate_holder(
    conn: SyncConn, pid: int, min_age: timedelta, wait_ms: int, now: datetime | None
) -> bool:
    """End `pid` if, at this moment, it still holds the horizon with a transaction at least
    `min_age` old and is neither this connection nor pgqueue's own; whether it exited within
    `wait_ms`."""
    params = {"pid": pid, "min_age": min_age, "wait_ms": wait_ms, "now": now}
    with conn.cursor(row_factory=args_row(Terminated)) as cur:
        row = cur.execute(query("session_terminate_holder", _NO_SCHEMA), params).fetchone()
    return row is not None and row.terminated
