"""The tasks' declarations in the database (tasks), where enqueue() in SQL reads the options
a job of the task gets when its call does not give them. Runs sql/queries/tasks.sql.

Only tasks with a handler in this process are written: a task declared by name
(`queue.declare`) is defined elsewhere, and the process that runs it owns its declaration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pgqueue.codec import encode_json
from pgqueue.queries import query
from pgqueue.store.plan import Plan, rows_as

if TYPE_CHECKING:
    from pgqueue.registry import Task


@dataclass(frozen=True)
class Synced:
    """A row of task_sync: a task whose declaration was new or changed."""

    name: str


def declaration(task: Task[..., Any]) -> dict[str, object]:
    """The task's row of tasks, as task_sync reads it: durations in seconds."""
    options, policy = task.options, task.policy
    return {
        "name": task.name,
        "queue": options.queue,
        "priority": options.priority,
        "max_attempts": options.max_attempts,
        "delay": _seconds(options.delay),
        "dedupe_window": _seconds(options.dedupe_window),
        "atomic": task.atomic,
        "concurrency_key": options.concurrency_key,
        "limit_keys": None if options.limits is None else list(options.limits),
        "fairness_key": options.fairness_key,
        "tags": None if options.tags is None else list(options.tags),
        "retry_base": policy.retry.base.total_seconds(),
        "retry_cap": policy.retry.cap.total_seconds(),
        "retry_jitter": policy.retry.jitter,
        "timeout": _seconds(policy.timeout),
        "on_lost": policy.on_lost,
        "compensate_with": policy.compensate_with,
    }


def sync_plan(schema: str, tasks: Iterable[Task[..., Any]]) -> Plan[list[str]]:
    """Write the declarations of `tasks` that have a handler; the names whose row was new or
    changed, in name order. No statement when none has a handler."""
    rows = [declaration(t) for t in sorted(tasks, key=lambda t: t.name) if t.fn is not None]
    if not rows:
        return []
    synced = yield query("task_sync", schema), {"tasks": encode_json(rows)}
    return sorted(row.name for row in rows_as(Synced, synced))


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()
