"""Retention: batches of deletes from the history table and from the periodic ticks, one
worker at a time. Runs sql/queries/history.sql."""

from __future__ import annotations

from datetime import datetime

from pgqueue.queries import query
from pgqueue.store.plan import Params, Plan, Rows

# What a prune deletes, each by its own statement: finished jobs, and periodic ticks.
PRUNE_STATEMENTS = {"jobs": "job_history_prune", "ticks": "periodic_tick_prune"}


def prune_batch_plan(schema: str, step: str, params: Params, *, lock: bool) -> Plan[Rows | None]:
    """Delete one batch of `step` ("jobs" or "ticks"); the rows deleted, each its time. With
    `lock` it first takes the schema's prune lock for the transaction, and deletes nothing
    (None) if another worker holds it."""
    if lock:
        rows = yield query("retention_lock", schema), {"schema": schema}
        if not rows[0][0]:
            return None
    return (yield query(PRUNE_STATEMENTS[step], schema), params)


def partitions_step_plan(schema: str, ahead: int, lock_ms: int) -> Plan[str | None]:
    """One step of the history partitions' upkeep; what it did, None when nothing is left."""
    rows = yield query("history_partitions_step", schema), {"ahead": ahead, "lock_ms": lock_ms}
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def partitions_drop_plan(
    schema: str, older_than: float, lock_ms: int, now: datetime | None
) -> Plan[list[tuple[str, int]]]:
    """Drop the history partitions past the cutoff; each one's name and estimated rows."""
    params = {"older_than": older_than, "lock_ms": lock_ms, "now": now}
    rows = yield query("history_partitions_drop", schema), params
    return [(str(name), int(estimate)) for name, estimate in rows]
