"""Queue controls: which queues are paused (queue_pauses), which have a rate limit
(rate_limits), and the rate limits of tasks and keys (job_rate_limits). Runs
sql/queries/queues.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pgqueue.models import QueuePause, RateLimit
from pgqueue.queries import query
from pgqueue.store.plan import Plan, rows_as


@dataclass(frozen=True)
class Newly:
    """A row of queue_pause: a queue that was not paused already."""

    queue: str


@dataclass(frozen=True)
class Resumed:
    """A row of queue_resume: a queue that was paused, and its workers told."""

    queue: str
    told: object


@dataclass(frozen=True)
class Paused:
    """A row of queue_list_paused."""

    queue: str
    paused_at: datetime
    reason: str


@dataclass(frozen=True)
class QueueRate:
    """A row of queue_rate_list: a queue's limit and its current window's starts."""

    queue: str
    max_starts: int
    period: float
    recent_starts: int
    room_in: float


@dataclass(frozen=True)
class JobRate:
    """A row of job_rate_list: a task's or a key's limit and its current window's starts."""

    kind: Literal["task", "key"]
    name: str
    max_starts: int
    period: float
    recent_starts: int
    room_in: float

    def limit(self) -> RateLimit:
        return RateLimit(
            task=self.name if self.kind == "task" else None,
            key=self.name if self.kind == "key" else None,
            max_starts=self.max_starts,
            period=self.period,
            recent_starts=self.recent_starts,
            room_in=self.room_in,
        )


@dataclass(frozen=True)
class Control:
    """A row of queue_controls: a queue (or task) and the control that applies to it."""

    name: str
    control: Literal["paused", "rated", "task", "keys", "fair"]


def pause_plan(
    schema: str, queues: Sequence[str], reason: str, now: datetime | None = None
) -> Plan[list[str]]:
    """Pause `queues`; those that were not paused already."""
    params = {"queues": list(queues), "reason": reason, "now": now}
    rows = yield query("queue_pause", schema), params
    return [row.queue for row in rows_as(Newly, rows)]


def resume_plan(schema: str, queues: Sequence[str]) -> Plan[list[str]]:
    """Resume `queues`, waking their workers to claim from the floor; those that were
    paused."""
    rows = yield query("queue_resume", schema), {"queues": list(queues)}
    return [row.queue for row in rows_as(Resumed, rows)]


def paused_plan(schema: str) -> Plan[list[QueuePause]]:
    """The paused queues, by name."""
    rows = yield query("queue_list_paused", schema), {}
    return [QueuePause.model_validate(row, from_attributes=True) for row in rows_as(Paused, rows)]


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
    return [RateLimit.model_validate(row, from_attributes=True) for row in rows_as(QueueRate, rows)]


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
    return [row.limit() for row in rows_as(JobRate, rows)]


@dataclass(frozen=True)
class Controls:
    """What workers must know of the queues: the paused ones, the rate-limited ones, the
    tasks with a rate limit, whether any concurrency key has one, and the queues that have
    had fair jobs (claimed fairly)."""

    paused: set[str]
    rated: set[str]
    limited_tasks: frozenset[str]
    key_limits: bool
    fair: set[str] = field(default_factory=set)


def controls_plan(schema: str) -> Plan[Controls]:
    """The queue controls workers follow."""
    rows = rows_as(Control, (yield query("queue_controls", schema), {}))
    return Controls(
        paused={row.name for row in rows if row.control == "paused"},
        rated={row.name for row in rows if row.control == "rated"},
        limited_tasks=frozenset(row.name for row in rows if row.control == "task"),
        key_limits=any(row.control == "keys" for row in rows),
        fair={row.name for row in rows if row.control == "fair"},
    )
