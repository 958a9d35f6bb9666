"""Retention: batches of deletes from the history table and from the periodic ticks, one
worker at a time, and of the durable steps of jobs that are gone. Runs sql/queries/history.sql."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgqueue.queries import query
from pgqueue.store.plan import Params, Plan, one_as, rows_as

# What a prune deletes, each by its own statement: finished jobs, and periodic ticks.
PRUNE_STATEMENTS = {"jobs": "job_history_prune", "ticks": "periodic_tick_prune"}


@dataclass(frozen=True)
class PruneLock:
    """retention_lock's row: whether this worker took the prune lock."""

    locked: bool


@dataclass(frozen=True)
class Pruned:
    """A row of job_history_prune or periodic_tick_prune: the time of a row deleted (a job's
    finished_at, a tick's time)."""

    at: datetime


@dataclass(frozen=True)
class PartitionsStep:
    """history_partitions_step's row: what the step did; None when nothing was left."""

    done: str | None


@dataclass(frozen=True)
class Dropped:
    """A row of history_partitions_drop."""

    partition: str
    estimated_rows: int


def prune_batch_plan(
    schema: str, step: str, params: Params, *, lock: bool
) -> Plan[list[datetime] | None]:
    """Delete one batch of `step` ("jobs" or "ticks"); the time of each row deleted. With
    `lock` it first takes the schema's prune lock for the transaction, and deletes nothing
    (None) if another worker holds it."""
    if lock:
        rows = yield query("retention_lock", schema), {"schema": schema}
        if not one_as(PruneLock, rows).locked:
            return None
    rows = yield query(PRUNE_STATEMENTS[step], schema), params
    return [row.at for row in rows_as(Pruned, rows)]


@dataclass(frozen=True)
class StepsPruned:
    """A row of job_steps_prune: a job whose recorded steps went."""

    job_id: int


def steps_prune_plan(schema: str, after: int | None, limit: int) -> Plan[list[int]]:
    """Delete the recorded steps (pgqueue/worker/durable.py) of at most `limit` jobs that are in
    neither the hot table nor the history, of ids above `after`; their ids, in order."""
    rows = yield query("job_steps_prune", schema), {"after": after, "limit": limit}
    return [row.job_id for row in rows_as(StepsPruned, rows)]


def partitions_step_plan(schema: str, ahead: int, lock_ms: int) -> Plan[str | None]:
    """One step of the history partitions' upkeep; what it did, None when nothing is left."""
    rows = yield query("history_partitions_step", schema), {"ahead": ahead, "lock_ms": lock_ms}
    return one_as(PartitionsStep, rows).done if rows else None


def partitions_drop_plan(
    schema: str, older_than: float, lock_ms: int, now: datetime | None
) -> Plan[list[tuple[str, int]]]:
    """Drop the history partitions past the cutoff; each one's name and estimated rows."""
    params = {"older_than": older_than, "lock_ms": lock_ms, "now": now}
    rows = yield query("history_partitions_drop", schema), params
    return [(row.partition, row.estimated_rows) for row in rows_as(Dropped, rows)]
