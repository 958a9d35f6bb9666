"""What an operator watches: queue counts, what holds back the xmin horizon, and VACUUM's view
of the hot jobs table; and the watchdog's one action, terminating sessions that hold it.

Owns: the reports behind `pgqueue status` and `pgqueue watchdog`, and `terminate`. A long
transaction anywhere in the database stops VACUUM from removing the jobs table's dead rows and
claims slow down; these reports name it (pid, application, age) so someone can act.

Invariants: nothing here writes to pgqueue's tables. `terminate` ends only client backends of
this database that still hold the horizon with a transaction at least `min_age` old, never the
calling connection and never pgqueue's own connections (application_name `pgqueue:...`, see
runtime/link.py). That guard is in the statement itself (session_terminate_holder), checked at
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

import psycopg

from pgqueue.errors import ConfigurationError, DatabaseError
from pgqueue.models import OutboxStats, RelayState
from pgqueue.store import health as store
from pgqueue.store import outbox as outbox_store
from pgqueue.store import relays as relays_store
from pgqueue.store.health import HorizonHolder, QueueDepth, QueueStats, Report, TableHealth
from pgqueue.store.plan import SyncConn, run

__all__ = [
    "HorizonHolder",
    "QueueDepth",
    "QueueStats",
    "Status",
    "TableHealth",
    "WatchdogReport",
    "horizon_holders",
    "queue_depth",
    "queue_stats",
    "status",
    "table_health",
    "terminate",
    "watch",
]

log = logging.getLogger("pgqueue.health")


class Status(Report):
    """Everything `pgqueue status` shows. Holders come oldest xid first."""

    schema_name: str
    queues: list[QueueStats]
    holders: list[HorizonHolder]
    jobs_table: TableHealth
    outbox: OutboxStats
    relays: list[RelayState]


class WatchdogReport(Report):
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


def queue_stats(conn: SyncConn, schema: str, *, now: datetime | None = None) -> list[QueueStats]:
    """Per-queue counts, ordered by queue name. `now` pins the clock (tests); default: the
    server's. Raises DatabaseError if `schema` has no pgqueue tables."""
    try:
        return store.queue_stats(conn, schema, now)
    except psycopg.errors.UndefinedTable:
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate --schema {schema}`"
        ) from None


def queue_depth(conn: SyncConn, schema: str) -> list[QueueDepth]:
    """Live jobs per queue and status, read from the hot table alone (never history): what a
    metrics scrape reads. Raises DatabaseError if `schema` has no pgqueue tables."""
    try:
        return store.queue_depth(conn, schema)
    except psycopg.errors.UndefinedTable:
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate --schema {schema}`"
        ) from None


def horizon_holders(
    conn: SyncConn,
    min_age: timedelta | None = None,
    *,
    now: datetime | None = None,
) -> list[HorizonHolder]:
    """Sessions, replication slots and prepared transactions holding back this database's xmin
    horizon, oldest xid first, never the calling connection. With `min_age`, only those whose
    transaction is at least that old (which leaves out slots: they have no start time)."""
    return store.horizon_holders(conn, min_age, now)


def table_health(conn: SyncConn, schema: str) -> TableHealth:
    """Dead and live rows and the last vacuum of `schema`.jobs. Raises DatabaseError if the
    table does not exist."""
    found = store.jobs_table_health(conn, schema)
    if found is None:
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate --schema {schema}`"
        )
    return found


def status(conn: SyncConn, schema: str, *, now: datetime | None = None) -> Status:
    """The queues of `schema`, the horizon holders of the database, and the jobs table."""
    return Status(
        schema_name=schema,
        queues=queue_stats(conn, schema, now=now),
        holders=horizon_holders(conn, now=now),
        jobs_table=table_health(conn, schema),
        outbox=outbox_stats(conn, schema),
        relays=run(conn, relays_store.list_plan(schema, RELAY_SILENCE), together=False),
    )


# A relay not heard from for this long (seconds) is presumed gone, and status leaves it out.
RELAY_SILENCE = 30.0


def outbox_stats(conn: SyncConn, schema: str) -> OutboxStats:
    """Staged messages and dead letters. Raises DatabaseError if `schema` predates the
    outbox."""
    try:
        return run(conn, outbox_store.stats_plan(schema), together=False)
    except psycopg.errors.UndefinedTable:
        raise DatabaseError(
            f"schema {schema!r} has no outbox yet: run `pgqueue migrate --schema {schema}`"
        ) from None


def terminate(
    conn: SyncConn,
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
    wait_ms = int(wait.total_seconds() * 1000)
    done = []
    for pid in dict.fromkeys(pids):
        try:
            if store.terminate_holder(conn, pid, min_age, wait_ms, now):
                done.append(pid)
        except psycopg.errors.InsufficientPrivilege as exc:
            log.warning("not permitted to terminate pid %s: %s", pid, exc)
    return done


def watch(conn: SyncConn, max_age: timedelta, *, act: bool) -> WatchdogReport:
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
