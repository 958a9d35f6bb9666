"""The queue_pauses table: which queues are paused. Runs sql/queries/queues.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgqueue.models import QueuePause
from pgqueue.queries import query
from pgqueue.store.plan import Plan


def pause_plan(
    schema: str, queues: Sequence[str], reason: str, now: datetime | None = None
) -> Plan[list[str]]:
    """Pause `queues`; those that were not paused already."""
    params = {"queues": list(queues), "reason": reason, "now": now}
    rows = yield query("queue_pause", schema), params
    return [str(row[0]) for row in rows]


def resume_plan(schema: str, queues: Sequence[str]) -> Plan[list[str]]:
    """Resume `queues`, waking their workers to claim from the floor; those that were
    paused."""
    rows = yield query("queue_resume", schema), {"queues": list(queues)}
    return [str(row[0]) for row in rows]


def paused_plan(schema: str) -> Plan[list[QueuePause]]:
    """The paused queues, by name."""
    rows = yield query("queue_list_paused", schema), {}
    return [QueuePause(queue=r[0], paused_at=r[1], reason=r[2]) for r in rows]
