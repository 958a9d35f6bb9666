"""Retention: batches of deletes from the history table and from the periodic ticks, one
worker at a time. Runs sql/queries/history.sql."""

from __future__ import annotations

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
