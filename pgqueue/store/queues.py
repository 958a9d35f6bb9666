"""Queue controls: which queues are paused (queue_pauses), which have a rate limit
(rate_limits), and the rate limits of tasks and keys (job_rate_limits). Runs
sql/queries/queues.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pgqueue.models import QueuePause, RateLimit
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


def set_rate_plan(schema: str, queue: str, max_starts: int, period: float) -> Plan[None]:
    """Limit `queue` to `max_starts` starts in any window of `period` seconds."""
    params = {"queue": queue, "max_starts": max_starts, "period": period}
    yield query("queue_rate_set", schema), params


def remove_rate_plan(schema: str, queue: str) -> Plan[bool]:
    """Remove `queue`'s rate limit; whether it had one."""
    rows = yield query("queue_rate_remove", schema), {"queue": queue}
    return bool(rows)


def rates_plan(schema: str) -> Plan[list[RateLimit]]:
    """Every rate limit, by queue, with its current window's starts."""
    rows = yield query("queue_rate_list", schema), {}
    return [
        RateLimit(queue=r[0], max_starts=r[1], period=r[2], recent_starts=r[3], room_in=r[4])
        for r in rows
    ]


def set_job_rate_plan(
    schema: str, kind: Literal["task", "key"], name: str, max_starts: int, period: float
) -> Plan[None]:
    """Limit the starts of task `name`'s jobs, or key `name`'s ('*': every key's default),
    to `max_starts` in any window of `period` seconds."""
    params = {"kind": kind, "name": name, "max_starts": max_starts, "period": period}
    yield query("job_rate_set", schema), params


def remove_job_rate_plan(schema: str, kind: Literal["task", "key"], name: str) -> Plan[bool]:
    """Remove a task's or a key's rate limit; whether it had one."""
    rows = yield query("job_rate_remove", schema), {"kind": kind, "name": name}
    return bool(rows)


def job_rates_plan(schema: str) -> Plan[list[RateLimit]]:
    """Every task's rate limit, then every key's, with their current window's starts."""
    rows = yield query("job_rate_list", schema), {}
    return [
        RateLimit(
            task=r[1] if r[0] == "task" else None,
            key=r[1] if r[0] == "key" else None,
            max_starts=r[2],
            period=r[3],
            recent_starts=r[4],
            room_in=r[5],
        )
        for r in rows
    ]


@dataclass(frozen=True)
class Controls:
    """What workers must know of the queues: the paused ones, the rate-limited ones, the
    tasks with a rate limit, and whether any concurrency key has one."""

    paused: set[str]
    rated: set[str]
    limited_tasks: frozenset[str]
    key_limits: bool


def controls_plan(schema: str) -> Plan[Controls]:
    """The queue controls workers follow."""
    rows = yield query("queue_controls", schema), {}
    return Controls(
        paused={r[0] for r in rows if r[1] == "paused"},
        rated={r[0] for r in rows if r[1] == "rated"},
        limited_tasks=frozenset(r[0] for r in rows if r[1] == "task"),
        key_limits=any(r[1] == "keys" for r in rows),
    )
