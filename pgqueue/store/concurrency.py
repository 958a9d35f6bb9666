"""The concurrency_limits and concurrency_slots tables: per-key limits (tenants), and the
worker's sweep that keeps them live. Runs sql/queries/concurrency.sql.

The guarantee, a key never has more running jobs than its limit, is kept by job_claim's
guarded upsert of the key's slot row and by the trigger that gives the slot back on every
way out of 'running'; nothing here can break it. The sweep only repairs liveness: waiting
jobs of keys with room are un-parked, and a counter that disagrees with the running jobs
(only possible after manual edits) is corrected under its row lock, with a warning.
"""

from __future__ import annotations

import logging

from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, Plan, fetch, fetch_one
from pgqueue.tenants import DEFAULT_KEY, ConcurrencyLimit, limit_key, limit_value

log = logging.getLogger("pgqueue.tenants")
UNPARK_BATCH = 1000  # waiting jobs let out per key per statement


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
    return [ConcurrencyLimit(key=r[0], max_running=r[1], running=r[2], waiting=r[3]) for r in rows]


async def sweep(conn: AsyncConn, schema: str) -> int:
    """One sweep on `conn` (autocommit), by one worker at a time. Returns the jobs un-parked;
    never waits for another worker's sweep."""
    async with conn.transaction():
        row = await fetch_one(conn, query("concurrency_sweep_lock", schema), {"schema": schema})
        if not row[0]:
            return 0
        for (key,) in await fetch(conn, query("concurrency_slot_suspects", schema)):
            await _fix(conn, schema, key)
        rows = await fetch(
            conn, query("concurrency_unpark", schema), {"key": None, "batch": UNPARK_BATCH}
        )
        return int(rows[0][0]) if rows else 0


async def _fix(conn: AsyncConn, schema: str, key: str) -> None:
    async with conn.transaction():  # a savepoint: the lock is held until the sweep commits
        await fetch(conn, query("concurrency_slot_lock", schema), {"key": key})
        fixed = await fetch(conn, query("concurrency_slot_fix", schema), {"key": key})
    if fixed:
        log.warning(
            "concurrency key %r counted %d running jobs but has %d; corrected (were jobs "
            "edited by hand?)",
            key,
            fixed[0][0],
            fixed[0][1],
        )
