"""Dedupe keys, job records, cancellation and retries, written once for both twins.

Owns: the multi-statement operations on the caller's connection. Each is a plan, a generator
that yields (statement, params) and is sent back the rows; `run` and `run_async` drive a plan
on a sync or async connection, the only place that differs. A plan whose statements must
commit together runs, on an autocommit connection, in a transaction of its own; otherwise in
the caller's transaction, which it never commits.

Invariants:
- dedupe: at most one queued, scheduled or running job per dedupe key (a unique index on the
  hot table), and every caller gets that job's id, however many transactions race
  (tests/integration/test_dedupe.py runs them in several processes). With a window, a job
  with the key that finished within it counts too. Under REPEATABLE READ or SERIALIZABLE a
  race with a concurrent enqueue of the same key is a serialization failure to retry.
- cancel: a queued or scheduled job is cancelled at once; a running one is marked and its
  worker told; an atomic job that is running cannot be interrupted (JobStateError).
- retry: only failed or cancelled jobs, through job_insert, linked by retry_of; one live
  retry per job.
Fails with JobNotFoundError, JobStateError, ConfigurationError (bad filters), DatabaseError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row
from pydantic import Field, field_validator

from pgqueue.errors import DatabaseError, JobNotFoundError, JobStateError
from pgqueue.models import (
    Cancellation,
    Enqueued,
    Job,
    JobOptions,
    JobPage,
    JobStatus,
    Settings,
)
from pgqueue.queries import query
from pgqueue.registry import NewJob, encode_json, encode_rows
from pgqueue.values import tolerate

T = TypeVar("T")
Step = tuple[Any, dict[str, Any] | None]
Rows = list[tuple[Any, ...]]
Plan = Generator[Step, Rows, T]
InsertBuilder = Callable[[Sequence[NewJob]], Step]

# A concurrent enqueue that commits the same key while ours waits is invisible to our
# statement's snapshot; each further round takes a new one. Two rounds settle any race that
# does not keep recurring; the bound only stops a pathological loop.
DEDUPE_ROUNDS = 20
# Rounds of job_cancel while the row is locked by a claim or completion in flight (those take
# milliseconds), a short pause apart: about a second in all before giving up.
CANCEL_ROUNDS = 50
CANCEL_PAUSE = 0.02


# -- drivers ----------------------------------------------------------------------------------


def _own_transaction(conn: Any, together: bool) -> Any:
    """A transaction for statements that must commit together on an autocommit connection;
    none otherwise (a caller's transaction is never committed here)."""
    return conn.transaction() if together and conn.autocommit else contextlib.nullcontext()


def run(conn: psycopg.Connection[Any], plan: Plan[T], *, together: bool = True) -> T:
    """Drive `plan` on `conn`; `together=False` for a plan whose statements each stand alone
    (then an autocommit connection pays no BEGIN and COMMIT)."""
    with _own_transaction(conn, together), conn.cursor(row_factory=tuple_row) as cur:
        tolerate(cur)  # a record holding what Python cannot represent still reads
        try:
            step = next(plan)
            while True:
                try:
                    cur.execute(*step)
                    rows = cur.fetchall() if cur.description is not None else []
                except psycopg.Error as exc:
                    step = plan.throw(exc)
                    continue
                step = plan.send(rows)
        except StopIteration as stop:
            result: T = stop.value
            return result


async def run_async(
    conn: psycopg.AsyncConnection[Any], plan: Plan[T], *, together: bool = True
) -> T:
    async with _own_transaction(conn, together), conn.cursor(row_factory=tuple_row) as cur:
        tolerate(cur)
        try:
            step = next(plan)
            while True:
                try:
                    await cur.execute(*step)
                    rows = await cur.fetchall() if cur.description is not None else []
                except psycopg.Error as exc:
                    step = plan.throw(exc)
                    continue
                step = plan.send(rows)
        except StopIteration as stop:
            result: T = stop.value
            return result


# -- enqueue with dedupe keys -------------------------------------------------------------------


def keyed(jobs: Sequence[NewJob]) -> bool:
    """Whether any job carries a dedupe key: only then does enqueue take several statements."""
    return any(job.options.dedupe_key is not None for job in jobs)


def enqueue_plan(
    jobs: Sequence[NewJob], schema: str, insert: InsertBuilder
) -> Plan[list[Enqueued]]:
    """Insert jobs; those with a dedupe key may resolve to an existing job. Ids come back in
    the order given. Jobs without a key take job_insert unchanged."""
    out: list[Enqueued | None] = [None] * len(jobs)
    plain = [i for i, job in enumerate(jobs) if job.options.dedupe_key is None]
    if plain:
        rows = yield insert([jobs[i] for i in plain])
        for i, row in zip(plain, rows, strict=True):
            out[i] = Enqueued(row[0])
    with_key = {i: job for i, job in enumerate(jobs) if job.options.dedupe_key is not None}
    if with_key:
        insert(list(with_key.values()))  # the payload size check, before anything is sent
        resolved = yield from _insert_keyed(with_key, schema)
        for i, enqueued in resolved.items():
            out[i] = enqueued
    assert all(item is not None for item in out)
    return [item for item in out if item is not None]


def _insert_keyed(pending: dict[int, NewJob], schema: str) -> Plan[dict[int, Enqueued]]:
    done: dict[int, Enqueued] = {}
    for _ in range(DEDUPE_ROUNDS):
        windowed = any(job.options.dedupe_window for job in pending.values())
        if windowed:
            yield query("dedupe_savepoint", schema), {}
        rows = yield (
            query("job_insert_unique", schema),
            {
                "jobs": encode_rows([job.as_row() | {"ord": i} for i, job in pending.items()]),
                "now": None,
            },
        )
        got = {int(ord_): (job_id, bool(created)) for ord_, job_id, created in rows}
        if windowed:
            if (yield from _lost_to_a_finish(pending, got, schema)):
                yield query("dedupe_rollback", schema), {}
                yield query("dedupe_release", schema), {}
                continue  # the next round's snapshot sees the finished job
            yield query("dedupe_release", schema), {}
        for i in list(pending):
            job_id, created = got[i]
            if job_id is not None:
                done[i] = Enqueued(job_id, created)
                del pending[i]
        if not pending:
            return done
    keys = sorted({str(job.options.dedupe_key) for job in pending.values()})
    raise DatabaseError(
        f"dedupe keys {keys} did not settle after {DEDUPE_ROUNDS} rounds of concurrent "
        "enqueues: retry the transaction"
    )


def _lost_to_a_finish(
    pending: dict[int, NewJob], got: dict[int, tuple[Any, bool]], schema: str
) -> Plan[bool]:
    """Whether a job we just created has a key whose window holds a job that finished after
    our snapshot (see job_dedupe_recheck)."""
    keys = [
        {"dedupe_key": job.options.dedupe_key, "dedupe_window": window.total_seconds()}
        for i, job in pending.items()
        if got[i][1] and (window := job.options.dedupe_window) is not None
    ]
    if not keys:
        return False
    rows = yield query("job_dedupe_recheck", schema), {"keys": encode_json(keys), "now": None}
    return bool(rows)


# -- reading records --------------------------------------------------------------------------


class JobFilter(Settings):
    """Filters of list_jobs; None means any. `concurrency_key` is the tenant (or other key) a
    job was enqueued with."""

    queue: str | None = None
    task: str | None = None
    concurrency_key: str | None = None
    status: tuple[JobStatus, ...] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    before_id: int | None = Field(default=None, ge=1)
    limit: int = Field(default=50, ge=1, le=1000)

    @field_validator("status", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, (str, JobStatus)) else value

    @field_validator("created_after", "created_before")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("times must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return value

    def params(self) -> dict[str, Any]:
        statuses = None if self.status is None else [s.value for s in self.status]
        return self.model_dump(exclude={"status"}) | {"statuses": statuses}


def list_plan(where: JobFilter, schema: str) -> Plan[JobPage]:
    rows = yield query("job_list", schema), where.params()
    jobs = [Job.from_row(row) for row in rows]
    full = len(jobs) == where.limit
    return JobPage(jobs=jobs, next_before_id=jobs[-1].id if full else None)


def get_plan(job_id: int, schema: str) -> Plan[Job | None]:
    rows = yield query("job_get", schema), {"id": job_id}
    return Job.from_row(rows[0]) if rows else None


def _require_job(job_id: int, schema: str) -> Plan[Job]:
    job = yield from get_plan(job_id, schema)
    if job is None:
        raise JobNotFoundError(f"no job has id {job_id}, live or in history")
    return job


# -- cancel and retry -------------------------------------------------------------------------


def cancel_plan(job_id: int, schema: str, keep_history: bool) -> Plan[Cancellation]:
    params = {"id": job_id, "now": None, "keep_history": keep_history}
    job: Job | None = None
    for _ in range(CANCEL_ROUNDS):
        rows = yield query("job_cancel", schema), params
        _locked, cancelled, requested = rows[0]
        if cancelled:
            return Cancellation.CANCELLED
        if requested:
            return Cancellation.REQUESTED
        job = yield from _require_job(job_id, schema)
        if job.finished:
            return Cancellation.FINISHED
        yield query("job_cancel_pause", schema), {"seconds": CANCEL_PAUSE}
    if job is not None and job.atomic:
        raise JobStateError(
            f"job {job_id} ({job.task}) is running as an atomic task: its run is one "
            "transaction that commits whole or not at all, so it cannot be cancelled midway. "
            "It ends at its timeout at the latest; cancel it again if it is retried"
        )
    raise JobStateError(f"job {job_id} stayed locked by another transaction; try again")


def retry_plan(job_id: int, schema: str, insert: InsertBuilder) -> Plan[Enqueued]:
    rows = yield query("job_retry_source", schema), {"id": job_id}
    if not rows:
        job = yield from _require_job(job_id, schema)
        raise JobStateError(
            f"job {job_id} is {job.status.value}: only failed or cancelled jobs can be retried"
        )
    original, queue, task, args, status, priority, max_attempts, atomic, live_retry, key = rows[0]
    if status not in (JobStatus.FAILED.value, JobStatus.CANCELLED.value):
        raise JobStateError(f"job {job_id} {status}: only failed or cancelled jobs can be retried")
    if live_retry is not None:
        raise JobStateError(f"job {job_id} is already being retried as job {live_retry}")
    options = JobOptions(
        queue=queue, priority=priority, max_attempts=max_attempts, concurrency_key=key
    )
    rows = yield insert([NewJob(task, args, options, atomic)])
    new_id = int(rows[0][0])
    try:
        yield query("job_link_retry", schema), {"id": new_id, "retry_of": original}
    except psycopg.errors.UniqueViolation:
        raise JobStateError(f"job {job_id} is already being retried by another job") from None
    return Enqueued(new_id)
