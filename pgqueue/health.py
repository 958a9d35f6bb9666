"""What an operator watches: queue counts, what holds back the xmin horizon, and VACUUM's view
of the hot jobs table; and the watchdog's one action, terminating sessions that hold it.

Owns: the reports behind `pgqueue status` and `pgqueue watchdog`, and `terminate`. A long
transaction anywhere in the database stops VACUUM from removing the jobs table's dead rows and
claims slow down; these reports name it (pid, application, age) so someone can act.

Invariants: nothing here writes to pgqueue's tables. `terminate` ends only client backends of
this database that still hold the horizon with a transaction at least `min_age` old, never the
calling connection and never pgqueue's own connections (application_name `pgqueue:...`, see
pgqueue/link.py). That guard is in the statement itself (session_terminate_holder), checked at
the moment of the kill, so a pid that was listed and has since let go is spared.

Fails: an unmigrated schema raises DatabaseError naming it; a session this role may not
terminate is logged and left alive; any other database error propagates as a psycopg error.
Pass an autocommit connection: inside a transaction PostgreSQL answers pg_stat_activity from a
snapshot taken at its first read, and that transaction would itself hold the horizon.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from pydantic import BaseModel, ConfigDict

from pgqueue.errors import ConfigurationError, DatabaseError
from pgqueue.queries import query

log = logging.getLogger("pgqueue.health")

# The horizon statements read only cluster views and render no {schema}: any valid name will do.
_NO_SCHEMA = "pgqueue"
_JOBS_TABLE = "jobs"

HolderKind = Literal["session", "replication_slot", "prepared_xact"]


class _Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class QueueStats(_Report):
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


class HorizonHolder(_Report):
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


class TableHealth(_Report):
    """VACUUM's view of one table; the counts are the statistics system's estimates."""

    schema_name: str
    table_name: str
    n_live_tup: int
    n_dead_tup: int
    last_vacuum: datetime | None
    last_autovacuum: datetime | None
    last_autoanalyze: datetime | None


class Status(_Report):
    """Everything `pgqueue status` shows. Holders come oldest xid first."""

    schema_name: str
    queues: list[QueueStats]
    holders: list[HorizonHolder]
    jobs_table: TableHealth


class WatchdogReport(_Report):
    """One watchdog pass. `holders` were at least `max_age` old when read; `remaining` are those
    of them still holding the horizon afterwards (all of them on a dry run)."""

    max_age: timedelta
    acted: bool
    holders: list[HorizonHolder]
    terminated: list[int]
    remaining: list[HorizonHolder]

    @property
    def clear(self) -> bool:
        return not self.remaining


def queue_stats(
    conn: psycopg.Connection[Any], schema: str, *, now: datetime | None = None
) -> list[QueueStats]:
    """Per-queue counts, ordered by queue name. `now` pins the clock (tests); default: the
    server's. Raises DatabaseError if `schema` has no pgqueue tables."""
    try:
        rows = _fetch(conn, query("queue_list_stats", schema), {"now": now})
    except psycopg.errors.UndefinedTable:
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate --schema {schema}`"
        ) from None
    return [QueueStats.model_validate(row) for row in rows]


def horizon_holders(
    conn: psycopg.Connection[Any],
    min_age: timedelta | None = None,
    *,
    now: datetime | None = None,
) -> list[HorizonHolder]:
    """Sessions, replication slots and prepared transactions holding back this database's xmin
    horizon, oldest xid first, never the calling connection. With `min_age`, only those whose
    transaction is at least that old (which leaves out slots: they have no start time)."""
    params = {"min_age": min_age, "now": now}
    rows = _fetch(conn, query("horizon_list_holders", _NO_SCHEMA), params)
    return [HorizonHolder.model_validate(row) for row in rows]


def table_health(conn: psycopg.Connection[Any], schema: str) -> TableHealth:
    """Dead and live rows and the last vacuum of `schema`.jobs. Raises DatabaseError if the
    table does not exist."""
    params = {"schema": schema, "table": _JOBS_TABLE}
    rows = _fetch(conn, query("table_read_health", schema), params)
    if not rows:
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate --schema {schema}`"
        )
    return TableHealth.model_validate(rows[0])


def status(conn: psycopg.Connection[Any], schema: str, *, now: datetime | None = None) -> Status:
    """The queues of `schema`, the horizon holders of the database, and the jobs table."""
    return Status(
        schema_name=schema,
        queues=queue_stats(conn, schema, now=now),
        holders=horizon_holders(conn, now=now),
        jobs_table=table_health(conn, schema),
    )


def terminate(
    conn: psycopg.Connection[Any],
    pids: Iterable[int],
    *,
    min_age: timedelta = timedelta(0),
    wait: timedelta = timedelta(seconds=5),
    now: datetime | None = None,
) -> list[int]:
    """Terminate those of `pids` that, at the moment of the kill, still hold the horizon with
    a transaction at least `min_age` old and are neither this connection nor pgqueue's own.

    Waits up to `wait` for each to exit. Returns the pids that were terminated and exited; the
    others were refused by the guard, not permitted (logged), or slower than `wait`.
    `conn` must be in autocommit mode, or the guard would read a stale pg_stat_activity.
    """
    if not conn.autocommit:
        raise ConfigurationError("terminate needs an autocommit connection (autocommit=True)")
    statement = query("session_terminate_holder", _NO_SCHEMA)
    wait_ms = int(wait.total_seconds() * 1000)
    done = []
    for pid in dict.fromkeys(pids):
        params = {"pid": pid, "min_age": min_age, "wait_ms": wait_ms, "now": now}
        try:
            row = conn.execute(statement, params).fetchone()
        except psycopg.errors.InsufficientPrivilege as exc:
            log.warning("not permitted to terminate pid %s: %s", pid, exc)
            continue
        if row is not None and row[0]:
            done.append(pid)
    return done


def watch(conn: psycopg.Connection[Any], max_age: timedelta, *, act: bool) -> WatchdogReport:
    """One watchdog pass: the holders at least `max_age` old; with `act`, terminate the
    terminable ones, then read again to see which of the listed holders still hold."""
    holders = horizon_holders(conn, max_age)
    if not act:
        return WatchdogReport(
            max_age=max_age, acted=False, holders=holders, terminated=[], remaining=holders
        )
    pids = [h.pid for h in holders if h.terminable and h.pid is not None]
    terminated = terminate(conn, pids, min_age=max_age)
    still = {h.key for h in horizon_holders(conn, max_age)}
    remaining = [h for h in holders if h.key in still]
    return WatchdogReport(
        max_age=max_age, acted=True, holders=holders, terminated=terminated, remaining=remaining
    )


def _fetch(
    conn: psycopg.Connection[Any], statement: sql.Composed, params: dict[str, Any]
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(statement, params)
        return cur.fetchall()
