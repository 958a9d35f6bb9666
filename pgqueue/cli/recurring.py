"""What `pgqueue recurring` lists: each recurring job as the workers stored it (and, given the
app, as the app defines it), with its next and last run and whether it is running at all.

A state, from what the database shows (and the app, when given):
  active      a worker's scheduler went over it lately: its ticks become jobs
  paused      its queue is paused: ticks still become jobs, which wait (known from the app)
  idle        no scheduler went over it lately: no worker runs it (stopped, --no-periodic,
              or the app dropped it), so no tick becomes a job
  not in app  the app given no longer defines it: its workers will not run it
  new         the app defines it but no worker has run it yet
  invalid     the stored definition cannot be read by this pgqueue version
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any

from pgqueue import words
from pgqueue.errors import ConfigurationError
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.schedule import Entry, RecurringJob
from pgqueue.store.periodic import StoredPeriodic
from pgqueue.worker.scheduler import MAX_SLEEP

# A running scheduler passes over its definitions at least every MAX_SLEEP; three missed
# passes is no scheduler, not a slow one.
IDLE_AFTER = 3 * MAX_SLEEP


@dataclasses.dataclass(frozen=True)
class Recurring:
    name: str
    task: str
    schedule: str  # in words: `every 5 minutes`, `daily at 06:00 UTC`
    state: str
    next_run: datetime | None
    last_run: datetime | None  # the latest tick that became a job
    last_job_id: int | None
    queue: str | None  # known from the app only
    last_pass: datetime | None  # when a scheduler last went over it
    definition: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("next_run", "last_run", "last_pass"):
            moment = data[key]
            data[key] = None if moment is None else moment.isoformat()
        return data


def listing(
    stored: list[StoredPeriodic], app: Queue | AsyncQueue | None, paused: set[str]
) -> list[Recurring]:
    """The stored definitions, then those only the app has; by name."""
    defined = {entry.periodic.name: entry for entry in app.periodics} if app else {}
    now = stored[0].checked_at if stored else datetime.now(timezone.utc)
    found = [_stored(row, defined.get(row.name), app is not None, paused) for row in stored]
    names = {row.name for row in stored}
    found += [_new(entry, now) for name, entry in defined.items() if name not in names]
    return sorted(found, key=lambda r: r.name)


def _stored(
    row: StoredPeriodic, entry: Entry | None, with_app: bool, paused: set[str]
) -> Recurring:
    queue = entry.job.options.queue if entry is not None else None
    try:
        periodic = RecurringJob.model_validate(dict(row.definition) | {"name": row.name})
    except (ValueError, ConfigurationError):
        periodic = None
    if periodic is None:
        state, schedule, next_run = "invalid", "-", None
    else:
        schedule = words.schedule(periodic.cron, periodic.every, periodic.timezone)
        next_run = periodic.next_after(max(row.last_tick, row.checked_at))
        state = _state(row, queue, with_app and entry is None, paused)
    return Recurring(
        name=row.name,
        task=str(row.definition.get("task", "-")),
        schedule=schedule,
        state=state,
        next_run=next_run,
        last_run=row.last_enqueued_tick,
        last_job_id=row.last_job_id,
        queue=queue,
        last_pass=row.updated_at,
        definition=dict(row.definition),
    )


def _state(row: StoredPeriodic, queue: str | None, dropped: bool, paused: set[str]) -> str:
    if dropped:
        return "not in app"
    if row.checked_at - row.updated_at > IDLE_AFTER:
        return "idle"
    return "paused" if queue in paused else "active"


def _new(entry: Entry, now: datetime) -> Recurring:
    p = entry.periodic
    return Recurring(
        name=p.name,
        task=p.task,
        schedule=words.schedule(p.cron, p.every, p.timezone),
        state="new",
        next_run=p.next_after(now),
        last_run=None,
        last_job_id=None,
        queue=entry.job.options.queue,
        last_pass=None,
        definition=p.definition(),
    )


def when(moment: datetime | None, now: datetime) -> str:
    """`in 4m12s` or `3m12s ago`, for a table cell; `never` for none."""
    if moment is None:
        return "never"
    if moment >= now:
        return f"in {words.age(moment - now)}"
    return f"{words.age(now - moment)} ago"
