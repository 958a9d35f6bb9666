"""The concurrency_limits and concurrency_slots tables: per-key limits (tenants), and the
worker's sweep that keeps them live. Runs sql/queries/concurrency.sql.

The guarantee, a key never has more running jobs than its limit, is kept by job_claim's
guarded upsert of the key's slot row and by the trigger that gives the slot back on every
way out of 'running'; nothing here can break it. The sweep only repairs liveness: waiting
jobs of keys with room are un-parked, and a counter that disagrees with the running jobs
(only possible after manual edits) is corrected under its row lock, with a warning. The
sweep also folds the fair claims' logged starts into per-bucket counts and drops counts older
than a day (fairness_start_log, fairness_starts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pgqueue.queries import query
from pgqueue.store import fairness
from pgqueue.store.plan import AsyncConn, Plan, execute, fetch, fetch_one, rows_as
from pgqueue.tenants import DEFAULT_KEY, ConcurrencyLimit, limit_key, limit_value

log = logging.getLogger("pgqueue.tenants")
UNPARK_BATCH = 1000  # waiting jobs let out per key per statement


@dataclass(frozen=True)
class LimitRow:
    """A row of concurrency_limit_list."""

    key: str
    max_running: int | None
    running: int
    waiting: int


@dataclass(frozen=True)
class SweepLock:
    """concurrency_sweep_lock's row: whether this worker took the sweep's lock."""

    locked: bool


@dataclass(frozen=True)
class Suspect:
    """A row of concurrency_slot_suspects: a key whose slot counter disagrees with its
    running jobs."""

    key: str


@dataclass(frozen=True)
class Unparked:
    """concurrency_unpark's row: how many waiting jobs were let out; the wake-ups sent."""

    unparked: int
    woken: int | None


@dataclass(frozen=True)
class SlotFix:
    """concurrency_slot_fix's row: the slot's counter before and after."""

    was: int
    now: int


def set_limit_plan(schema: str, key: str | None, max_running: int | None) -> Plan[None]:
    """Set (max_running given) or remove (None) a key's limit; key None is the default.
    Waiting jobs a raise makes room for are woken at commit. Checks both at once, before
    any connection is taken."""
    name = limit_key(key)
    limit = None if max_running is None else limit_value(name, max_running)
    return _set_limit(schema, name, limit)


def _set_limit(schema: str, name: str, limit: int | None) -> Plan[None]:
    if limit is None:
        yield query("concurrency_limit_delete", schema), {"key": name}
        return
    yield query("concurrency_limit_set", schema), {"key": name, "max_running": limit}
    unpark_key = None if name == DEFAULT_KEY else name
    yield query("concurrency_unpark", schema), {"key": unpark_key, "batch": UNPARK_BATCH}


def list_limits_plan(schema: str) -> Plan[list[ConcurrencyLimit]]:
    """Every key with a limit, running jobs or waiting jobs; the default ('*') first."""
    rows = yield query("concurrency_limit_list", schema), {}
    return [
        ConcurrencyLimit.model_validate(row, from_attributes=True)
        for row in rows_as(LimitRow, rows)
    ]


async def sweep(conn: AsyncConn, schema: str) -> int:
    """One sweep on `conn` (autocommit), by one worker at a time. Returns the jobs un-parked;
    never waits for another worker's sweep."""
    async with conn.transaction():
        lock = query("concurrency_sweep_lock", schema)
        if not (await fetch_one(conn, SweepLock, lock, {"schema": schema})).locked:
            return 0
        for suspect in await fetch(conn, Suspect, query("concurrency_slot_suspects", schema)):
            await _fix(conn, schema, suspect.key)
        unpark = query("concurrency_unpark", schema)
        params = {"key": None, "batch": UNPARK_BATCH}
        unparked = (await fetch_one(conn, Unparked, unpark, params)).unparked
        await fairness.prune_starts(conn, schema)
        return unparked


async def _fix(conn: AsyncConn, schema: str, key: str) -> None:
    async with conn.transaction():  # a savepoint: the lock is held until the sweep commits
        await execute(conn, query("concurrency_slot_lock", schema), {"key": key})
        fixed = await fetch(conn, SlotFix, query("concurrency_slot_fix", schema), {"key": key})
    for fix in fixed:
        log.warning(
            "concurrency key %r counted %d running jobs but has %d; corrected (were jobs "
            "edited by hand?)",
            key,
            fix.was,
            fix.now,
        )
