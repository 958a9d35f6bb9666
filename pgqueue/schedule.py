"""Recurring job definitions and their ticks, as pure functions of time. No I/O here.

Owns: validating a definition once, at registration (a 5-field cron expression parsed by
cronsim with Debian cron's semantics, in UTC or a named zone; or an interval aligned to the
Unix epoch, so `every=timedelta(hours=1)` ticks on the hour), and answering, for any instant,
which ticks fall in a window and which came last. Ticks are whole seconds and timezone-aware,
so every worker computes the same ticks for the same definition, whatever its clock.
Also owns the decision of one scheduler pass (`decide`): which ticks to enqueue and which are
missed, given the latest tick already dealt with.
Fails with ConfigurationError naming the bad expression, interval, zone or policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator, Field, field_validator, model_validator

from pgqueue.errors import ConfigurationError
from pgqueue.models import TASK_NAME, NewJob, Settings, check_identifier, one_of

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SECOND = timedelta(seconds=1)
MISSED_POLICIES = ("skip", "run_once")
DEFAULT_GRACE = timedelta(minutes=1)
MAX_GRACE = timedelta(hours=1)
MAX_EVERY = timedelta(days=366)
MAX_TICKS_PER_PASS = 1000


class RecurringJob(Settings):
    """One recurring job: which task, with which fixed arguments, on which schedule.

    Exactly one of `cron` (5 fields: minute hour day-of-month month day-of-week, in
    `timezone`) and `every` (whole seconds, ticks at multiples of it since the Unix epoch).
    `missed` says what happens to ticks no worker enqueued within `grace` of their time:
    `skip` drops them; `run_once` enqueues one job, for the latest of them.
    """

    name: str
    task: str
    args: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = None
    every: timedelta | None = None
    timezone: str = "UTC"
    missed: Annotated[str, AfterValidator(lambda v: one_of(v, MISSED_POLICIES, "missed"))] = "skip"
    grace: timedelta | None = None

    @field_validator("name", "task")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_identifier("periodic task", value, TASK_NAME)

    @field_validator("every")
    @classmethod
    def _every(cls, value: timedelta | None) -> timedelta | None:
        if value is None:
            return None
        if value < SECOND or value > MAX_EVERY or value % SECOND:
            raise ValueError(f"every must be whole seconds from 1 s to {MAX_EVERY.days} days")
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if len(value.split()) != 5:
            raise ValueError(
                "cron takes 5 fields: minute hour day-of-month month day-of-week, "
                "for example '*/5 * * * *'"
            )
        try:
            CronSim(value, EPOCH)
        except CronSimError as exc:
            raise ValueError(f"invalid cron expression: {exc}") from None
        return " ".join(value.split())

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        _zone(value)
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> RecurringJob:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron='*/5 * * * *' or every=timedelta(...)")
        if self.every is not None and self.timezone != "UTC":
            raise ValueError("timezone applies to cron schedules; every= ticks in UTC")
        if self.grace is not None:
            limit = min(MAX_GRACE, self.every or MAX_GRACE)
            if not SECOND <= self.grace <= limit:
                raise ValueError(
                    f"grace={self.grace} must be from 1 s to {limit} (and at most `every`, "
                    "so a late pass never enqueues a burst of ticks)"
                )
        return self

    @property
    def effective_grace(self) -> timedelta:
        """How late a tick may be enqueued and still count as on time."""
        if self.grace is not None:
            return self.grace
        return min(DEFAULT_GRACE, self.every or DEFAULT_GRACE)

    def definition(self) -> dict[str, Any]:
        """What workers compare to tell a changed definition: everything but the name."""
        data = self.model_dump(mode="json", exclude={"name"})
        data["grace"] = self.effective_grace.total_seconds()
        return data

    def ticks(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Ticks t with after < t <= until, oldest first."""
        tick = self.next_after(after)
        while tick <= until:
            yield tick
            tick = self.next_after(tick)

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after `moment`."""
        if self.every is not None:
            return EPOCH + self.every * ((moment - EPOCH) // self.every + 1)
        assert self.cron is not None
        start = moment.astimezone(_zone(self.timezone))
        return next(CronSim(self.cron, start)).astimezone(timezone.utc)

    def latest_at_or_before(self, moment: datetime) -> datetime:
        """The last tick at or before `moment`."""
        if self.every is not None:
            return EPOCH + self.every * ((moment - EPOCH) // self.every)
        assert self.cron is not None
        # CronSim walks back from a whole second, exclusive: start one second after
        # the whole second at or before `moment` (ticks are whole seconds).
        start = moment.replace(microsecond=0) + SECOND
        found = next(CronSim(self.cron, start.astimezone(_zone(self.timezone)), reverse=True))
        return found.astimezone(timezone.utc)


def _zone(name: str) -> timezone | ZoneInfo:
    if name == "UTC":
        return timezone.utc  # cronsim's fast path; ZoneInfo("UTC") would take the DST one
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Riga'"
        ) from None


@dataclasses.dataclass(frozen=True)
class PassDecision:
    """What one scheduler pass does for one definition."""

    enqueue: list[datetime]
    last_tick: datetime
    missed: tuple[datetime, datetime] | None = None  # first and last missed tick, if any
    changed: bool = False


def decide(
    periodic: RecurringJob, stored: dict[str, Any], last_tick: datetime, now: datetime
) -> PassDecision:
    """Decide one pass: every tick after `last_tick` up to `now` is dealt with exactly once.

    Ticks within grace of `now` are on time and each enqueued. Older ones were missed (no
    worker ran): `skip` drops them, `run_once` enqueues their latest. A changed definition
    catches up nothing from before the change: only ticks within grace still run.
    """
    grace = periodic.effective_grace
    changed = stored != periodic.definition()
    if changed:
        last_tick = max(last_tick, now - grace)
    enqueue: list[datetime] = []
    missed = None
    cutoff = now - grace
    if last_tick < cutoff:
        latest_missed = periodic.latest_at_or_before(cutoff)
        if latest_missed > last_tick:
            missed = (periodic.next_after(last_tick), latest_missed)
            if periodic.missed == "run_once":
                enqueue.append(latest_missed)
    for tick in periodic.ticks(max(last_tick, cutoff), now):
        if len(enqueue) >= MAX_TICKS_PER_PASS:
            break
        enqueue.append(tick)
    done = enqueue[-1] if enqueue else periodic.latest_at_or_before(now)
    return PassDecision(enqueue, max(last_tick, done), missed, changed)


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered definition with the validated job each tick enqueues."""

    periodic: RecurringJob
    job: NewJob


class Schedules:
    """The recurring jobs a Queue or AsyncQueue defines; workers schedule these."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def add(self, periodic: RecurringJob, job: NewJob) -> None:
        if periodic.name in self._entries:
            raise ConfigurationError(
                f"periodic job {periodic.name!r} is defined twice; pass name= to tell them apart"
            )
        self._entries[periodic.name] = Entry(periodic, job)

    def __iter__(self) -> Iterator[Entry]:
        return iter(sorted(self._entries.values(), key=lambda e: e.periodic.name))

    def __len__(self) -> int:
        return len(self._entries)
