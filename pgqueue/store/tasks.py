"""The tasks' declarations in the database (tasks), where enqueue() in SQL reads the options
a job of the task gets when its call does not give them. Runs sql/queries/tasks.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgqueue.codec import encode_json
from pgqueue.models import TaskDeclaration
from pgqueue.queries import query
from pgqueue.store.plan import Plan, rows_as


@dataclass(frozen=True)
class Synced:
    """A row of task_sync: a task whose declaration was new or changed."""

    name: str


def sync_plan(schema: str, declarations: Sequence[TaskDeclaration]) -> Plan[list[str]]:
    """Write `declarations`; the names whose row was new or changed, in name order. No
    statement when there are none."""
    if not declarations:
        return []
    rows = [d.as_row() for d in sorted(declarations, key=lambda d: d.name)]
    synced = yield query("task_sync", schema), {"tasks": encode_json(rows)}
    return sorted(row.name for row in rows_as(Synced, synced))
