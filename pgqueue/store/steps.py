"""The steps a job recorded, and the transactions of an atomic job's segments (worker/durable.py).
Runs sql/queries/steps.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgqueue.models import ClaimedJob, JobStep, JobSteps
from pgqueue.queries import query, statement
from pgqueue.store.plan import Pipelined, Plan, Rows, Step, rows_as


@dataclass(frozen=True, slots=True)
class Recorded:
    """One recorded step of a job: its place, name, kind (step, sleep, signal) and result."""

    seq: int
    name: str
    kind: str
    result: object  # JSON, as psycopg reads jsonb


@dataclass(frozen=True, slots=True)
class Journal:
    """The steps a job recorded, in order, and the database's clock when they were read."""

    steps: list[Recorded]
    now: datetime


@dataclass(frozen=True, slots=True)
class _Listed:
    """A row of job_steps_read: a recorded step (all None when the job recorded none) and
    the clock."""

    seq: int | None
    name: str | None
    kind: str | None
    result: object
    now: datetime


@dataclass(frozen=True, slots=True)
class _Written:
    """A row of job_step_record: the result recorded, and when."""

    result: object
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class _Found:
    """A row of job_step_read: a step already recorded, and the clock."""

    name: str
    kind: str
    result: object
    now: datetime


def _guard(job: ClaimedJob) -> dict[str, object]:
    return {"job_id": job.id, "worker_id": job.worker_id, "attempt": job.attempt}


def read_plan(schema: str, job_id: int) -> Plan[Journal]:
    """The job's recorded steps, in order."""
    rows = rows_as(_Listed, (yield query("job_steps_read", schema), {"job_id": job_id}))
    steps = [
        Recorded(row.seq, row.name, row.kind, row.result)
        for row in rows
        if row.seq is not None and row.name is not None and row.kind is not None
    ]
    return Journal(steps, rows[0].now)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A record to make: `step` of `job` (its result as JSON text `encoded`; or a sleep of
    `sleep_seconds`, ending by the database's clock), begun at `started_at`."""

    job: ClaimedJob
    step: Recorded
    started_at: datetime
    encoded: str | None
    sleep_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class _WrittenOne:
    """A row of job_step_record_many: which record went in, its result, and when."""

    job_id: int
    seq: int
    result: object
    finished_at: datetime


def _record_params(record: StepRecord) -> dict[str, object]:
    step = record.step
    return {
        "job_id": record.job.id,
        "seq": step.seq,
        "name": step.name,
        "kind": step.kind,
        "result": record.encoded,
        "sleep_seconds": record.sleep_seconds,
        "started_at": record.started_at,
    }


def record_plan(schema: str, record: StepRecord) -> Plan[tuple[Recorded, datetime] | None]:
    """Make `record`: the step as recorded, which is the one found if it already was, and the
    database's clock. None when the job is no longer running this attempt for this worker and
    the step was not recorded."""
    step = record.step
    params = _guard(record.job) | _record_params(record)
    written = rows_as(_Written, (yield query("job_step_record", schema), params))
    if written:
        return Recorded(step.seq, step.name, step.kind, written[0].result), written[0].finished_at
    return (yield from _found_plan(schema, record))


def record_many_plan(
    schema: str, records: Sequence[StepRecord]
) -> Plan[list[tuple[Recorded, datetime] | None]]:
    """Make `records` in one statement: for each, in order, what record_plan returns for it
    alone. A record whose job is no longer ours leaves the others recorded."""
    if len(records) == 1:  # the statement for one record costs the server less
        return [(yield from record_plan(schema, records[0]))]
    params = {
        "job_ids": [r.job.id for r in records],
        "worker_ids": [r.job.worker_id for r in records],
        "attempts": [r.job.attempt for r in records],
        "seqs": [r.step.seq for r in records],
        "names": [r.step.name for r in records],
        "kinds": [r.step.kind for r in records],
        "results": [r.encoded for r in records],
        "sleep_seconds": [r.sleep_seconds for r in records],
        "started_ats": [r.started_at for r in records],
    }
    rows = rows_as(_WrittenOne, (yield query("job_step_record_many", schema), params))
    written = {(row.job_id, row.seq): row for row in rows}
    made: list[tuple[Recorded, datetime] | None] = []
    for record in records:
        step, row = record.step, written.get((record.job.id, record.step.seq))
        if row is None:
            made.append((yield from _found_plan(schema, record)))
        else:
            made.append((Recorded(step.seq, step.name, step.kind, row.result), row.finished_at))
    return made


def _found_plan(schema: str, record: StepRecord) -> Plan[tuple[Recorded, datetime] | None]:
    """A record that did not go in: the step already recorded at its place, if one is."""
    where = {"job_id": record.job.id, "seq": record.step.seq}
    found = rows_as(_Found, (yield query("job_step_read", schema), where))
    if not found:
        return None
    row = found[0]
    return Recorded(record.step.seq, row.name, row.kind, row.result), row.now


@dataclass(frozen=True, slots=True)
class _Shown:
    """A row of job_steps_list."""

    seq: int
    name: str
    kind: str
    result: object
    started_at: datetime | None
    finished_at: datetime


@dataclass(frozen=True, slots=True)
class Waiting:
    """A row of job_waits_read: what a scheduled job waits for, a signal or a sleep's end."""

    id: int
    waiting_for: str | None
    waiting_until: datetime | None
    waiting_since: datetime | None
    sleeping_until: datetime | None


def waits_plan(
    schema: str, job_ids: list[int], now: datetime | None = None
) -> Plan[dict[int, Waiting]]:
    """Of `job_ids`, those waiting on a durable call (a sleep, a signal), by id."""
    rows = yield query("job_waits_read", schema), {"ids": job_ids, "now": now}
    return {row.id: row for row in rows_as(Waiting, rows)}


def steps_plan(schema: str, job_id: int) -> Plan[JobSteps]:
    """A job's recorded steps, whole, and what it waits for now (Queue.job_steps)."""
    rows = rows_as(_Shown, (yield query("job_steps_list", schema), {"job_id": job_id}))
    waits = yield from waits_plan(schema, [job_id])
    wait = waits.get(job_id)
    return JobSteps(
        job_id=job_id,
        steps=[
            JobStep(
                seq=row.seq,
                name=row.name,
                kind=row.kind,  # type: ignore[arg-type]  # the table's CHECK keeps it one of them
                result=row.result,
                started_at=row.started_at,
                finished_at=row.finished_at,
            )
            for row in rows
        ],
        sleeping_until=wait.sleeping_until if wait else None,
        waiting_for=wait.waiting_for if wait else None,
        waiting_until=wait.waiting_until if wait else None,
        waiting_since=wait.waiting_since if wait else None,
    )


def _one(name: str, schema: str, params: dict[str, object] | None = None) -> Plan[Rows]:
    # Rendered once: an atomic lane runs the segment statements for every job it runs.
    rows = yield statement(name, schema), params
    return rows


def segment_begin_plan(
    schema: str, job: ClaimedJob | None, *, savepoint: bool = True
) -> Plan[bool]:
    """Open an atomic job's next segment: BEGIN, then (given the job) lock its row again,
    and set the savepoint. False when the job is no longer ours (nothing is locked then)."""
    yield from _one("job_segment_begin", schema)
    found = True
    if job is not None:
        found = bool((yield from _one("job_segment_lock", schema, _guard(job))))
    if savepoint:
        yield from _one("job_segment_savepoint", schema)
    return found


def segment_savepoint_plan(schema: str) -> Plan[None]:
    """Mark where the handler's writes of the segment start."""
    yield from _one("job_segment_savepoint", schema)


def segment_discard_plan(schema: str) -> Plan[None]:
    """Roll back the handler's writes of this segment; the savepoint stays."""
    yield from _one("job_segment_discard", schema)


def segment_end_plan(schema: str, *, keep: bool) -> Plan[None]:
    """End the handler's part of the segment, keeping its writes or rolling them back."""
    if not keep:
        yield from _one("job_segment_discard", schema)
    yield from _one("job_segment_release", schema)


def _segment_next_steps(schema: str, job: ClaimedJob | None) -> list[Step]:
    """Keep the handler's writes, commit the segment, open the next (relocking `job`, given)
    and set its savepoint: the relock, when sent, is the next to last statement."""
    steps: list[Step] = [
        (statement("job_segment_release", schema), None),
        (statement("job_segment_commit", schema), None),
        (statement("job_segment_begin", schema), None),
    ]
    if job is not None:
        steps.append((statement("job_segment_lock", schema), _guard(job)))
    steps.append((statement("job_segment_savepoint", schema), None))
    return steps


def segment_next(schema: str, job: ClaimedJob | None) -> Pipelined[bool]:
    """After a durable call's own statements: keep the handler's writes, commit the segment,
    and open the next as segment_begin_plan does, in one round trip. False when the job is no
    longer ours (nothing is locked then). A commit that fails raises its error; the
    statements after it did not run, so no transaction is open."""
    steps = _segment_next_steps(schema, job)

    def read(rows: list[Rows]) -> bool:
        return job is None or bool(rows[-2])

    return Pipelined(tuple(steps), read)


@dataclass(frozen=True, slots=True)
class Segmented:
    """A step recorded in an atomic job's segment, committed, and the next segment opened:
    the step as recorded and the database's clock, and whether the job is still ours."""

    made: tuple[Recorded, datetime]
    ours: bool


def segment_record_next(schema: str, record: StepRecord) -> Pipelined[Segmented]:
    """Record a step of an atomic job in its segment, then end the segment and open the next
    as segment_next does, all in one round trip. A record or a commit that fails raises its
    error, and nothing after it ran: the segment did not commit."""
    recording: Step = (statement("job_step_record_segment", schema), _record_params(record))
    steps = [recording, *_segment_next_steps(schema, record.job)]

    def read(rows: list[Rows]) -> Segmented:
        written = rows_as(_Written, rows[0])[0]
        step = record.step
        made = Recorded(step.seq, step.name, step.kind, written.result), written.finished_at
        return Segmented(made, bool(rows[-2]))

    return Pipelined(tuple(steps), read)


def segment_commit_plan(schema: str) -> Plan[None]:
    """Commit the segment: the claim, the handler's writes, the step's record."""
    yield from _one("job_segment_commit", schema)
