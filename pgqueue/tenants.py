"""Per-key concurrency limits (tenants): setting and listing limits, and the worker's sweep.

Owns: the concurrency_limits rows (a key's max_running; '*' is the default for keys without
a row; no '*' row means such keys are unlimited) and the safety-net sweep. The guarantee, a
key never has more running jobs than its limit, is kept by job_claim's guarded upsert of the
key's slot row and by the trigger of migration 0005 that gives the slot back on every way out
of 'running'; nothing here can break it. The sweep only repairs liveness: waiting jobs of
keys with room are un-parked, and a counter that disagrees with the running jobs (only
possible after manual edits) is corrected under its row lock, with a warning.
Fails with ConfigurationError on a bad key or limit; the sweep never raises on a busy lock.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

from pgqueue.errors import ConfigurationError
from pgqueue.models import CONCURRENCY_KEY
from pgqueue.queries import query

log = logging.getLogger("pgqueue.tenants")
DEFAULT_KEY = "*"
UNPARK_BATCH = 1000  # waiting jobs let out per key per statement
Statement = tuple[Any, dict[str, Any]]


class ConcurrencyLimit(BaseModel):
    """One key as `Queue.concurrency_limits()` lists it. key '*' is the default limit;
    max_running None: no row of its own (the default applies)."""

    model_config = ConfigDict(frozen=True)

    key: str
    max_running: int | None
    running: int
    waiting: int


def refuse_keyed_atomic(task: str, key: str) -> None:
    raise ConfigurationError(
        f"task {task!r} is atomic and cannot take concurrency_key={key!r}: an atomic job holds "
        "a transaction, not a slot; use a lease (non-atomic) task for per-key limits"
    )


def _key(key: str | None) -> str:
    if key is None:
        return DEFAULT_KEY
    if not isinstance(key, str) or not CONCURRENCY_KEY.fullmatch(key):
        raise ConfigurationError(
            f"invalid concurrency key {key!r}: 1-255 characters without NUL; pass key=None "
            "(or --default) for the default limit"
        )
    return key


def set_statements(schema: str, key: str | None, max_running: int | None) -> list[Statement]:
    """Statements that set (max_running given) or remove (None) a key's limit; key None is
    the default. Run them in one transaction, in order."""
    name = _key(key)
    if max_running is None:
        return [(query("concurrency_limit_delete", schema), {"key": name})]
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 0:
        raise ConfigurationError(
            f"max_running={max_running!r} for key {name!r}: give a whole number, 0 or more "
            "(0 pauses the key)"
        )
    unpark_key = None if name == DEFAULT_KEY else name
    return [
        (query("concurrency_limit_set", schema), {"key": name, "max_running": max_running}),
        (query("concurrency_unpark", schema), {"key": unpark_key, "batch": UNPARK_BATCH}),
    ]


def list_statement(schema: str) -> Statement:
    return query("concurrency_limit_list", schema), {}


def decode_limits(rows: list[Any]) -> list[ConcurrencyLimit]:
    return [ConcurrencyLimit(key=r[0], max_running=r[1], running=r[2], waiting=r[3]) for r in rows]


async def sweep(conn: Any, schema: str) -> int:
    """One sweep on `conn` (autocommit), by one worker at a time. Returns the jobs un-parked."""
    async with conn.transaction():
        cur = await conn.execute(query("concurrency_sweep_lock", schema), {"schema": schema})
        row = await cur.fetchone()
        if not row or not row[0]:
            return 0
        cur = await conn.execute(query("concurrency_slot_suspects", schema))
        for (key,) in await cur.fetchall():
            await _fix(conn, schema, key)
        cur = await conn.execute(
            query("concurrency_unpark", schema), {"key": None, "batch": UNPARK_BATCH}
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def _fix(conn: Any, schema: str, key: str) -> None:
    async with conn.transaction():  # a savepoint: the lock is held until the sweep commits
        await conn.execute(query("concurrency_slot_lock", schema), {"key": key})
        cur = await conn.execute(query("concurrency_slot_fix", schema), {"key": key})
        fixed = await cur.fetchone()
    if fixed:
        log.warning(
            "concurrency key %r counted %d running jobs but has %d; corrected (were jobs "
            "edited by hand?)",
            key,
            fixed[0],
            fixed[1],
        )
