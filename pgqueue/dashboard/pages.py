"""What each page of the dashboard shows, read through pgqueue's own API and store.

Owns: one function per page, taking a connection and returning what its template renders,
and the jobs page's filter, parsed from the query string with the same rules as `pgqueue
jobs list`. Nothing here writes.

Invariants: every read is an index lookup or a read of the hot tables and the server's
views; the jobs page pages by id (keyset) and never counts history. A filter a user typed
wrong is a FilterError with a message to show, never a database error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg

from pgqueue import health, words
from pgqueue.errors import ConfigurationError, DatabaseError, PgQueueError
from pgqueue.models import Job, JobStatus, JobSteps
from pgqueue.queue import Queue
from pgqueue.schedule import RecurringJob
from pgqueue.store.health import QueueActivity, queue_activity
from pgqueue.store.jobs import newest_id_plan
from pgqueue.store.periodic import list_periodic
from pgqueue.store.plan import SyncConn, run
from pgqueue.store.steps import Waiting, waits_plan
from pgqueue.store.workers import WorkersStore
from pgqueue.tenants import ConcurrencyLimit, FairShare

PAGE_SIZE = 50
# Job ids one page of the jobs list looks through at most: it bounds what a rare filter reads
# of history, and the page offers to look further back.
SEARCH_WINDOW = 50_000
HORIZON_WARNING = timedelta(minutes=5)


class FilterError(PgQueueError):
    """A jobs filter that cannot be read; its message says which and why."""


@dataclass(frozen=True)
class JobFilterForm:
    """The jobs page's filter as typed: every field a string, empty meaning any."""

    queue: str = ""
    task: str = ""
    status: str = ""
    tenant: str = ""
    since: str = ""
    until: str = ""
    before_id: str = ""

    FIELDS = ("queue", "task", "status", "tenant", "since", "until", "before_id")

    @classmethod
    def read(cls, params: Any) -> JobFilterForm:
        return cls(**{name: str(params.get(name, "")).strip()[:200] for name in cls.FIELDS})

    def filters(self) -> dict[str, Any]:
        """list_jobs' keyword arguments; raises FilterError naming the field at fault."""
        found: dict[str, Any] = {}
        for name, key in (("queue", "queue"), ("task", "task"), ("tenant", "concurrency_key")):
            if value := getattr(self, name):
                found[key] = value
        if self.status:
            try:
                found["status"] = tuple(JobStatus(s.strip()) for s in self.status.split(","))
            except ValueError:
                allowed = ", ".join(s.value for s in JobStatus)
                raise FilterError(f"status {self.status!r}: use one of {allowed}") from None
        for name, key in (("since", "created_after"), ("until", "created_before")):
            if value := getattr(self, name):
                found[key] = _moment(name, value)
        if self.before_id:
            if not self.before_id.isdigit() or int(self.before_id) < 1:
                raise FilterError(f"before_id {self.before_id!r} is not a job id")
            found["before_id"] = int(self.before_id)
        return found

    def query(self, **changes: str) -> dict[str, str]:
        """The non-empty fields, with `changes`: for links to the next page."""
        values = {name: getattr(self, name) for name in self.FIELDS} | changes
        return {k: v for k, v in values.items() if v}


def _moment(name: str, text: str) -> datetime:
    """'10m', '2h', '3d' ago, or an ISO time (UTC when it names no zone)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[:-1].isdigit() and text[-1] in units:
        return datetime.now(timezone.utc) - timedelta(seconds=int(text[:-1]) * units[text[-1]])
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise FilterError(f"{name} {text!r}: give 10m, 2h, 3d or an ISO time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class JobsPage:
    """A page of the jobs list: its jobs, the ids it looked through (above `floor`, below
    `top`), and where the next page starts (None: nothing older)."""

    jobs: list[Job]
    top: int
    floor: int
    next_before_id: int | None
    window_ran_out: bool  # the page is short because the search window ended, not history
    # Its scheduled jobs that sleep (ctx.sleep) or are parked for a signal, by id.
    waiting: dict[int, Waiting] = field(default_factory=dict)


def jobs(conn: SyncConn, queue: Queue, form: JobFilterForm) -> JobsPage:
    """At most PAGE_SIZE jobs, looking through at most SEARCH_WINDOW ids: a filter that
    matches rarely costs a bounded walk, and the page offers to look further back."""
    filters = form.filters()
    try:
        newest = run(conn, newest_id_plan(queue.schema), together=False)
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
        raise DatabaseError(
            f"schema {queue.schema!r} has no pgqueue tables: run "
            f"`pgqueue migrate --schema {queue.schema}`"
        ) from None
    top = filters.pop("before_id", None) or (newest or 0) + 1
    floor = max(top - 1 - SEARCH_WINDOW, 0)
    try:
        found = queue.list_jobs(
            conn=conn, limit=PAGE_SIZE, before_id=top, after_id=floor or None, **filters
        )
    except ConfigurationError as exc:
        raise FilterError(str(exc)) from None
    ran_out = found.next_before_id is None and floor > 0
    scheduled = [j.id for j in found.jobs if j.status is JobStatus.SCHEDULED]
    # One statement for the page's scheduled jobs, none when it shows none.
    waiting = run(conn, waits_plan(queue.schema, scheduled), together=False) if scheduled else {}
    return JobsPage(
        jobs=found.jobs,
        top=top,
        floor=floor,
        next_before_id=found.next_before_id or (floor + 1 if ran_out else None),
        window_ran_out=ran_out,
        waiting=waiting,
    )


@dataclass(frozen=True)
class JobDetail:
    """A job's page: its record, and its durable steps and what it waits for."""

    job: Job
    steps: JobSteps


def job(conn: SyncConn, queue: Queue, job_id: int) -> JobDetail | None:
    found = queue.get_job(job_id, conn=conn)
    if found is None:
        return None
    return JobDetail(found, queue.job_steps(job_id, conn=conn))


def pretty(value: Any) -> str:
    """A stored JSON value as the job page shows it (escaped by the template, not here)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def compact(value: Any) -> str:
    """A stored JSON value on one line, as a table cell shows it (escaped by the template)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def queues(conn: SyncConn, schema: str) -> list[QueueActivity]:
    """Read from the hot table, and from history only by index over short ranges: the page
    costs the same however busy the queues are."""
    return queue_activity(conn, schema)


def workers(conn: SyncConn, schema: str) -> list[Any]:
    return WorkersStore(schema).list(conn, limit=500)


SHARE_WINDOW = timedelta(minutes=5)


@dataclass(frozen=True)
class Tenants:
    """The tenants page: every limit key, and every fairness key's share of its queue's
    starts over SHARE_WINDOW against the share owed."""

    limits: list[ConcurrencyLimit]
    shares: list[FairShare]
    window_minutes: int = int(SHARE_WINDOW.total_seconds() // 60)


def tenants(conn: SyncConn, queue: Queue) -> Tenants:
    limits = queue.concurrency_limits(conn=conn)
    return Tenants(limits, queue.fair_shares(window=SHARE_WINDOW, conn=conn))


@dataclass(frozen=True)
class Recurring:
    name: str
    task: str
    schedule: str
    last_tick: datetime
    last_enqueued_tick: datetime | None
    last_job_id: int | None
    next_run: datetime | None
    problem: str | None = None


def recurring(conn: SyncConn, schema: str) -> list[Recurring]:
    found = []
    for row in list_periodic(conn, schema):
        definition = dict(row.definition)
        # As stored, until the definition reads: then as a person would say it.
        schedule = str(definition.get("cron") or f"every {definition.get('every')}")
        next_run, problem = None, None
        try:
            periodic = RecurringJob.model_validate(definition | {"name": row.name})
            schedule = words.schedule(periodic.cron, periodic.every, periodic.timezone)
            next_run = periodic.next_after(max(row.last_tick, datetime.now(timezone.utc)))
        except (ValueError, ConfigurationError) as exc:
            problem = f"cannot read this definition: {exc}"
        found.append(
            Recurring(
                name=row.name,
                task=str(definition.get("task", "")),
                schedule=schedule,
                last_tick=row.last_tick,
                last_enqueued_tick=row.last_enqueued_tick,
                last_job_id=row.last_job_id,
                next_run=next_run,
                problem=problem,
            )
        )
    return found


@dataclass
class HealthPage:
    holders: list[health.HorizonHolder]
    jobs_table: health.TableHealth
    verdict: str
    clear: bool
    outbox: Any
    relays: list[Any] = field(default_factory=list)


def health_page(conn: SyncConn, schema: str, warning: timedelta = HORIZON_WARNING) -> HealthPage:
    status = health.status(conn, schema)
    report = health.watch(conn, warning, act=False)
    if report.clear:
        verdict = (
            f"clear: no transaction has held the horizon for {words.duration(warning)} or more"
        )
    else:
        oldest = report.remaining[0]
        verdict = (
            f"held: {len(report.remaining)} holder(s) older than {words.duration(warning)}; the "
            "oldest is "
            f"{oldest.kind} {oldest.pid or oldest.name} ({oldest.application_name or '-'})"
        )
    return HealthPage(
        holders=status.holders,
        jobs_table=status.jobs_table,
        verdict=verdict,
        clear=report.clear,
        outbox=status.outbox,
        relays=status.relays,
    )
