"""The jobs table: every statement of sql/queries/jobs.sql, for the application and the worker.

Every state change is one statement guarded in its WHERE (status, worker, attempt), so a late
or duplicate write cannot move a job that another actor already moved. The application's side
(insert, dedupe, records, cancel, retry) is written as plans that either twin drives; the
worker's side is `JobsStore`, on the worker's own async connections.

Invariants:
- dedupe: at most one queued, scheduled or running job per dedupe key (a unique index on the
  hot table), and every caller gets that job's id, however many transactions race. With a
  window, a job with the key that finished within it counts too. Under REPEATABLE READ or
  SERIALIZABLE a race with a concurrent enqueue of the same key is a serialization failure to
  retry.
- cancel: a queued or scheduled job is cancelled at once; a running one is marked and its
  worker told; an atomic job that is running cannot be interrupted (JobStateError).
- retry: only failed or cancelled jobs, through job_insert, linked by retry_of; one live
  retry per job.
Raises pgqueue's errors for what a caller asked wrongly (JobNotFoundError, JobStateError,
InvalidArgumentsError, ConfigurationError) and psycopg's for the database's own failures,
which the twins translate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
from psycopg.rows import tuple_row

from pgqueue.bulk import Batch
from pgqueue.codec import encode_args, encode_json, encode_rows, too_large
from pgqueue.errors import DatabaseError, JobNotFoundError, JobStateError
from pgqueue.models import (
    RATE_START_MARGIN,
    Cancellation,
    ClaimedJob,
    Enqueued,
    Job,
    JobFilter,
    JobOptions,
    JobPage,
    JobStatus,
    NewJob,
)
from pgqueue.queries import channel, query, statement
from pgqueue.store import fairness
from pgqueue.store.plan import (
    AsyncConn,
    Plan,
    Rows,
    Step,
    SyncConn,
    execute,
    fetch,
    fetch_one,
    one_as,
    rows_as,
    run_async,
)
from pgqueue.store.workers import bound_idle
from pgqueue.tenants import check_keyed_atomic
from pgqueue.wakeup import Position

# A concurrent enqueue that commits the same key while ours waits is invisible to our
# statement's snapshot; each further round takes a new one. Two rounds settle any race that
# does not keep recurring; the bound only stops a pathological loop.
DEDUPE_ROUNDS = 20
# Rounds of job_cancel while the row is locked by a claim or completion in flight (those take
# milliseconds), a short pause apart: about a second in all before giving up.
CANCEL_ROUNDS = 50
CANCEL_PAUSE = 0.02


# -- enqueue ------------------------------------------------------------------------------------


def insert(
    jobs: Sequence[NewJob],
    schema: str,
    max_payload_bytes: int | None = None,
    *,
    alone: bool = False,
    vtimes: Sequence[float | None] | None = None,
    trace_context: str | None = None,
) -> Step:
    """The job_insert statement and its parameters for a batch of validated jobs; for one
    job, a single-row insert: job_insert_one when it is its transaction's only statement
    (`alone`), which has no wake-ups of other statements to fold its own with, else
    job_insert_single, which folds them in a function. Each returns one row per job, its id,
    in the order given (see `enqueued`).

    Raises InvalidArgumentsError, naming the job and its size, if one job's arguments are
    larger than max_payload_bytes; nothing is stored. `vtimes` are the fair jobs' virtual
    start times (fairness.stamp_plan), None for the others. `trace_context` (JSON text, the
    enqueue hooks' `Enqueuing.trace_context`) is stored in every job's row.
    """
    for job in jobs:
        if job.atomic:
            check_keyed_atomic(job.task, job.options)
    # A job with several limit keys or a fairness key takes job_insert even alone: only it
    # stores them.
    if len(jobs) == 1 and jobs[0].options.limits is None and vtimes is None:
        return _insert_one(jobs[0], schema, max_payload_bytes, alone, trace_context)
    if vtimes is None:
        rows = encode_rows([j.as_row() for j in jobs])
    else:
        rows = encode_rows([j.as_row() | {"vtime": v} for j, v in zip(jobs, vtimes, strict=True)])
    if max_payload_bytes is not None and len(rows) > max_payload_bytes:
        _refuse_huge(jobs, max_payload_bytes)  # only now is it worth sizing each job
    params = {"jobs": rows, "now": None, "channel": channel(schema)}
    return statement("job_insert", schema), params | {"trace_context": trace_context}


def _insert_one(
    job: NewJob, schema: str, max_payload_bytes: int | None, alone: bool, trace_context: str | None
) -> Step:
    """A single job's insert: typed parameters, no JSON batch to unpack."""
    params = job.as_row()
    params["args"] = args = encode_args(job)
    if max_payload_bytes is not None and len(args) > max_payload_bytes:
        _refuse_huge([job], max_payload_bytes)
    params["now"] = None
    params["trace_context"] = trace_context
    return statement("job_insert_one" if alone else "job_insert_single", schema), params


def _refuse_huge(jobs: Sequence[NewJob], limit: int) -> None:
    for index, job in enumerate(jobs):
        size = len(encode_args(job))  # as job_insert_one and COPY measure it
        if size > limit:
            raise too_large(index, job, size, limit)


def enqueued(rows: Rows) -> list[Enqueued]:
    """The ids an insert returned, in the order the jobs were given."""
    return rows_as(_inserted, rows)


def _inserted(id: int, woke: object = None) -> Enqueued:
    """A row of job_insert, job_insert_single or job_insert_one (whose `woke` is the wake-up
    it sent) as the job's id, built straight from its columns."""
    return Enqueued(id)


def insert_plan(jobs: Sequence[NewJob], schema: str) -> Plan[list[Enqueued]]:
    """`insert` as a plan, for a caller that composes it with other statements."""
    return enqueued((yield insert(jobs, schema)))


def _copy_transaction(conn: SyncConn | AsyncConn) -> Any:  # sync or async, as `conn`
    return conn.transaction() if conn.autocommit else contextlib.nullcontext()


@dataclass(frozen=True)
class Reserved:
    """job_id_reserve's row: the ids taken from the jobs id sequence."""

    ids: list[int]


def _copy_ids(rows: Rows) -> list[int]:
    return sorted(one_as(Reserved, rows).ids)


def copy_in(
    conn: SyncConn,
    jobs: Sequence[NewJob],
    schema: str,
    limit: int | None,
    trace_context: str | None = None,
) -> list[Enqueued]:
    """Store a batch bulk.copyable accepts through COPY: job_id_reserve takes the ids first
    (COPY cannot return them), job_copy streams the rows with those ids (and `trace_context`,
    as `insert` stores it), and job_wake names each queue's lowest (priority, id), as
    job_insert's wake-up does. Ids in the order given."""
    with _copy_transaction(conn), conn.cursor(row_factory=tuple_row) as cur:
        with conn.pipeline():  # the server takes the ids while the batch is rendered
            cur.execute(statement("job_id_reserve", schema), {"n": len(jobs)})
            batch = Batch.of(jobs, limit)
            ids = _copy_ids(cur.fetchall())
        traced = query("job_copy_traced" if trace_context else "job_copy", schema)
        with cur.copy(traced) as copy:
            copy.write(batch.copy_text(ids, trace_context))
        cur.execute(statement("job_wake", schema), batch.wake_params(ids))
    return [Enqueued(i) for i in ids]


async def copy_in_async(
    conn: AsyncConn,
    jobs: Sequence[NewJob],
    schema: str,
    limit: int | None,
    trace_context: str | None = None,
) -> list[Enqueued]:
    """`copy_in` on an async connection."""
    async with _copy_transaction(conn), conn.cursor(row_factory=tuple_row) as cur:
        async with conn.pipeline():
            await cur.execute(statement("job_id_reserve", schema), {"n": len(jobs)})
            batch = Batch.of(jobs, limit)
            ids = _copy_ids(await cur.fetchall())
        traced = query("job_copy_traced" if trace_context else "job_copy", schema)
        async with cur.copy(traced) as copy:
            await copy.write(batch.copy_text(ids, trace_context))
        await cur.execute(statement("job_wake", schema), batch.wake_params(ids))
    return [Enqueued(i) for i in ids]


def reserve_ids_plan(n: int, schema: str) -> Plan[list[int]]:
    """`n` ids from the jobs id sequence, ascending, for jobs inserted with their ids."""
    rows = yield statement("job_id_reserve", schema), {"n": n}
    return _copy_ids(rows)


def keyed(jobs: Sequence[NewJob]) -> bool:
    """Whether any job carries a dedupe or fairness key: only then does enqueue take several
    statements."""
    return any(
        job.options.dedupe_key is not None or job.options.fairness_key is not None for job in jobs
    )


def enqueue_plan(
    jobs: Sequence[NewJob],
    schema: str,
    max_payload_bytes: int | None,
    trace_context: str | None = None,
) -> Plan[list[Enqueued]]:
    """Insert jobs; those with a dedupe key may resolve to an existing job. Ids come back in
    the order given. Jobs without a key take job_insert unchanged. `trace_context` as
    `insert` takes it."""
    out: list[Enqueued | None] = [None] * len(jobs)
    vtimes = yield from fairness.stamp_plan(jobs, schema)
    plain = [i for i, job in enumerate(jobs) if job.options.dedupe_key is None]
    if plain:
        fair = None if not fairness.fair(jobs) else [vtimes[i] for i in plain]
        rows = yield insert(
            [jobs[i] for i in plain],
            schema,
            max_payload_bytes,
            vtimes=fair,
            trace_context=trace_context,
        )
        for i, job_id in zip(plain, enqueued(rows), strict=True):
            out[i] = job_id
    with_key = {i: job for i, job in enumerate(jobs) if job.options.dedupe_key is not None}
    if with_key:
        # The size check, before anything is sent.
        insert(list(with_key.values()), schema, max_payload_bytes)
        resolved = yield from _insert_keyed(with_key, schema, vtimes, trace_context)
        for i, job_id in resolved.items():
            out[i] = job_id
    assert all(item is not None for item in out)
    return [item for item in out if item is not None]


@dataclass(frozen=True)
class Unique:
    """A row of job_insert_unique: the job at `ord` in the batch, its id (None while a
    concurrent enqueue of its key is unsettled), and whether this statement created it."""

    ord: int
    id: int | None
    created: bool


def _insert_keyed(
    pending: dict[int, NewJob],
    schema: str,
    vtimes: Sequence[float | None],
    trace_context: str | None,
) -> Plan[dict[int, Enqueued]]:
    done: dict[int, Enqueued] = {}
    for _ in range(DEDUPE_ROUNDS):
        windowed = any(job.options.dedupe_window for job in pending.values())
        if windowed:
            yield query("dedupe_savepoint", schema), {}
        rows = yield (
            query("job_insert_unique", schema),
            {
                "jobs": encode_rows(
                    [job.as_row() | {"ord": i, "vtime": vtimes[i]} for i, job in pending.items()]
                ),
                "now": None,
                "trace_context": trace_context,
            },
        )
        got = {row.ord: (row.id, row.created) for row in rows_as(Unique, rows)}
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
    pending: dict[int, NewJob], got: dict[int, tuple[int | None, bool]], schema: str
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


# -- records ------------------------------------------------------------------------------------

# The columns of job_get, job_list and job_list_live, in order.
JOB_COLUMNS = (
    "id",
    "queue",
    "task",
    "args",
    "status",
    "priority",
    "attempt",
    "max_attempts",
    "run_at",
    "created_at",
    "started_at",
    "finished_at",
    "worker_id",
    "errors",
    "result",
    "dedupe_key",
    "retry_of",
    "cancel_requested_at",
    "atomic",
    "concurrency_key",
    "workflow_id",
    "progress",
    "tags",
    "limit_keys",
    "fairness_key",
)


def job_from_row(row: Sequence[object]) -> Job:
    """A record from a row in JOB_COLUMNS order (trailing columns may be missing). An
    errors column that could not be read (values.Unreadable) becomes one error saying so."""
    fields = dict(zip(JOB_COLUMNS, row, strict=False))
    if isinstance(fields.get("errors"), dict):
        fields["errors"] = [fields["errors"]]
    return Job.model_validate(fields)


def list_plan(where: JobFilter, schema: str) -> Plan[JobPage]:
    rows = yield query("job_list", schema), where.params()
    jobs = [job_from_row(row) for row in rows]
    full = len(jobs) == where.limit
    return JobPage(jobs=jobs, next_before_id=jobs[-1].id if full else None)


@dataclass(frozen=True)
class Newest:
    """job_read_newest_id's row."""

    id: int | None


def newest_id_plan(schema: str) -> Plan[int | None]:
    """The newest job id, live or finished; None when there is no job."""
    rows = yield query("job_read_newest_id", schema), {}
    return one_as(Newest, rows).id


def get_plan(job_id: int, schema: str) -> Plan[Job | None]:
    rows = yield query("job_get", schema), {"id": job_id}
    return job_from_row(rows[0]) if rows else None


def _require_job(job_id: int, schema: str) -> Plan[Job]:
    job = yield from get_plan(job_id, schema)
    if job is None:
        raise JobNotFoundError(f"no job has id {job_id}, live or in history")
    return job


def list_live_plan(schema: str, task: str | None) -> Plan[list[Job]]:
    """Jobs still waiting or running in the hot table, oldest first."""
    rows = yield query("job_list_live", schema), {"task": task}
    return [job_from_row(row) for row in rows]


# -- cancel and retry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cancelled:
    """job_cancel's row: how many jobs it locked, cancelled at once, and asked their workers
    to cancel; what settling the history's counts returned."""

    locked: int
    cancelled: int
    requested: int
    settled: int | None
    waiters: int | None  # notices sent to callers waiting for the job (notify_waiters)


def cancel_plan(job_id: int, schema: str, keep_history: bool) -> Plan[Cancellation]:
    params = {"id": job_id, "now": None, "keep_history": keep_history}
    job: Job | None = None
    for _ in range(CANCEL_ROUNDS):
        row = one_as(Cancelled, (yield query("job_cancel", schema), params))
        if row.cancelled:
            return Cancellation.CANCELLED
        if row.requested:
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


@dataclass(frozen=True)
class RetrySource:
    """job_retry_source's row: a finished job as a retry copies it, and the id of its retry
    still queued or running, if any."""

    id: int
    queue: str
    task: str
    args: dict[str, object]
    status: str
    priority: int
    max_attempts: int
    atomic: bool
    live_retry: int | None
    concurrency_key: str | None
    tags: list[str] | None
    limit_keys: list[str] | None
    fairness_key: str | None


def retry_plan(job_id: int, schema: str, max_payload_bytes: int | None) -> Plan[Enqueued]:
    rows = yield query("job_retry_source", schema), {"id": job_id}
    if not rows:
        job = yield from _require_job(job_id, schema)
        raise JobStateError(
            f"job {job_id} is {job.status.value}: only failed or cancelled jobs can be retried"
        )
    source = one_as(RetrySource, rows)
    if source.status not in (JobStatus.FAILED.value, JobStatus.CANCELLED.value):
        raise JobStateError(
            f"job {job_id} {source.status}: only failed or cancelled jobs can be retried"
        )
    if source.live_retry is not None:
        raise JobStateError(f"job {job_id} is already being retried as job {source.live_retry}")
    options = JobOptions(
        queue=source.queue,
        priority=source.priority,
        max_attempts=source.max_attempts,
        concurrency_key=source.concurrency_key,
        limits=None if source.limit_keys is None else tuple(source.limit_keys),
        fairness_key=source.fairness_key,
        tags=None if source.tags is None else tuple(source.tags),
    )
    new = NewJob(source.task, source.args, options, source.atomic)
    # As an enqueue does: a fair job takes its virtual start time from its key's clock now.
    [new_id] = yield from enqueue_plan([new], schema, max_payload_bytes)
    try:
        yield query("job_link_retry", schema), {"id": new_id, "retry_of": source.id}
    except psycopg.errors.UniqueViolation:
        raise JobStateError(f"job {job_id} is already being retried by another job") from None
    return Enqueued(new_id)


# -- atomic jobs: claimed, run and finished in one transaction ----------------------------------


@dataclass(frozen=True, slots=True)
class AtomicClaimParams:
    """job_claim_atomic's parameters: one atomic job of `tasks` in `queues`, for the worker
    `worker_id`."""

    queues: Sequence[str]
    tasks: Sequence[str]
    worker_id: int
    now: datetime | None = None

    def as_params(self) -> dict[str, object]:
        """The statement's named parameters."""
        return {
            "queues": list(self.queues),
            "tasks": list(self.tasks),
            "worker_id": self.worker_id,
            "now": self.now,
        }


def claim_atomic_plan(
    schema: str, params: AtomicClaimParams, backstop_ms: int
) -> Plan[ClaimedJob | None]:
    """Claim one atomic job for the caller's open transaction, which the server ends if it
    idles longer than `backstop_ms` (a hung worker frees the job)."""
    yield from bound_idle(schema, backstop_ms)
    rows = yield query("job_claim_atomic", schema), params.as_params()
    return one_as(ClaimedJob, rows) if rows else None


def retake_atomic_plan(schema: str, job: ClaimedJob) -> Plan[bool]:
    """In the caller's new transaction, take back an atomic job whose commit was refused
    (job_atomic_retake); False when it is no longer there for this attempt."""
    guard = {"job_id": job.id, "worker_id": job.worker_id, "attempt": job.attempt}
    return bool((yield query("job_atomic_retake", schema), guard))


def finish_plan(schema: str, outcomes: Sequence[OutcomeRow], keep_history: bool) -> Plan[Finished]:
    """job_finish_many as a plan, for an atomic job's own transaction."""
    rows = yield statement("job_finish_many", schema), finish_params(outcomes, keep_history)
    return one_as(Finished, rows)


# -- the worker's side ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimParams:
    """One claim's parameters (job_claim, job_claim_unkeyed, job_claim_rated): jobs of
    `queue` after the position `after` and before `before` in the claim index, at most
    `limit`, for the worker `worker_id`; the tasks with a rate limit of their own, whether any
    job limit (a task's or a key's) applies, and the margin within which a rate-limited job's
    handler must start."""

    queue: str
    after: Position
    before: Position
    limit: int
    worker_id: int
    limited_tasks: Sequence[str] = ()
    job_limits: bool = False
    start_margin: timedelta = RATE_START_MARGIN
    now: datetime | None = None

    def as_params(self) -> dict[str, object]:
        """The statements' named parameters."""
        return {
            "queue": self.queue,
            "after_priority": self.after[0],
            "after_id": self.after[1],
            "before_priority": self.before[0],
            "before_id": self.before[1],
            "limit": self.limit,
            "worker_id": self.worker_id,
            "now": self.now,
            "limited_tasks": list(self.limited_tasks),
            "job_limits": self.job_limits,
            "start_margin": self.start_margin,
        }


class OutcomeRow(Protocol):
    """What an outcome gives job_finish_many (executor.Outcome): one JSON object, the job it
    is of, and its status (succeeded, failed, retry or cancelled)."""

    @property
    def job(self) -> ClaimedJob: ...

    @property
    def status(self) -> str: ...

    def as_json(self) -> str: ...


@dataclass(frozen=True)
class SweepFound:
    """What job_sweep_find saw in one slice: the table's pages, and the positions of the
    queued jobs at or before the hint (their priorities and ids, in claim order)."""

    pages: int
    priorities: list[int]
    ids: list[int]

    @property
    def jobs(self) -> list[Position]:
        return list(zip(self.priorities, self.ids, strict=True))


@dataclass
class Claimed:
    """One claim statement's result: the jobs to run, and the positions of the jobs it parked
    (their concurrency key is full); both count as walked."""

    jobs: list[ClaimedJob]
    parked: list[Position]
    snapshot: ClaimSnapshot | None = None  # job_claim_unkeyed's last row

    @property
    def walked(self) -> int:
        return len(self.jobs) + len(self.parked)

    @property
    def top(self) -> Position | None:
        """The highest position among them, where the next claim may start."""
        tops = [(job.priority, job.id) for job in self.jobs] + self.parked
        return max(tops) if tops else None


@dataclass(frozen=True)
class Finished:
    """job_finish_many's row: how many jobs finished, went back to the queue to retry, and
    moved to history; the wake-ups sent; what settling the history's counts returned."""

    finished: int
    retried: int
    archived: int
    woken: int = 0
    settled: int | None = None
    told: int | None = None  # notices sent to callers waiting for these jobs (notify_waiters)


@dataclass(frozen=True)
class JobId:
    """A row of the statements that return job ids alone (job_release_orphans,
    job_list_cancel_requested)."""

    id: int


@dataclass(frozen=True)
class Promoted:
    """job_promote_due's row: how many due jobs it made queued, in how many seconds the next
    scheduled one falls due (None: none is), and the wake-ups sent."""

    promoted: int
    next_due_in: float | None
    woken: int


@dataclass(frozen=True)
class FailedOutOfRange:
    """job_fail_out_of_range's row: how many jobs failed, how many moved to history, what
    settling the history's counts returned."""

    failed: int
    archived: int
    settled: int | None


@dataclass(frozen=True, slots=True)
class Parked:
    """A claim's row for a job it did not claim: its key was full, or a rate limit put it
    back."""

    priority: int
    id: int


@dataclass(frozen=True)
class ClaimSnapshot:
    """job_claim_unkeyed's last row: whether it met a job with a key, or of a limited task,
    and so claimed nothing; the transactions in progress in its snapshot, the snapshot's xmax
    (it names none from there on), and the claim's own transaction id if it has one, drawn
    after the snapshot."""

    keyed: bool
    in_progress: list[int]
    xmax: int | None
    xid: int | None


@dataclass(frozen=True)
class RateRoom:
    """job_claim_rated's last row: in how many seconds the queue's limit has room again (0:
    now), and in how many the first job put back falls due (None: none was)."""

    room_in: float
    back_in: float | None


def _unkeyed_row(
    id: int | None,
    task: str,
    args: dict[str, object],
    priority: int,
    attempt: int,
    max_attempts: int,
    queue: str,
    worker_id: int,
    parked: bool | None,
    trace_context: dict[str, object] | None,
    waited: float | None,
    xip: list[int] | None,
    xmax: int | None,
    xid: int | None,
) -> ClaimedJob | ClaimSnapshot:
    """A row of job_claim_unkeyed, built straight from its columns as _claim_row's."""
    if id is None:
        return ClaimSnapshot(bool(parked), xip or [], xmax, xid)
    return ClaimedJob(
        id,
        task,
        args,
        priority,
        attempt,
        max_attempts,
        queue,
        worker_id,
        trace_context,
        waited,
        unkeyed=True,
    )


def _claim_row(
    id: int | None,
    task: str,
    args: dict[str, object],
    priority: int,
    attempt: int,
    max_attempts: int,
    queue: str,
    worker_id: int,
    parked: bool | None,
    trace_context: dict[str, object] | None,
    waited: float | None,
    room_in: float | None = None,
    back_in: float | None = None,
) -> ClaimedJob | Parked | RateRoom | None:
    """A row of job_claim or job_claim_rated (the one statement with room_in and back_in),
    built straight from its columns: the claim is the worker's hottest path, so no row
    becomes a dict, or an object it then copies. A parked row has only id and priority;
    RateRoom's row has no id (a row without an id or a room is nothing to act on)."""
    if id is None:
        return RateRoom(room_in, back_in) if room_in is not None else None
    if parked:
        return Parked(priority, id)
    return ClaimedJob(
        id, task, args, priority, attempt, max_attempts, queue, worker_id, trace_context, waited
    )


def finish_params(outcomes: Sequence[OutcomeRow], keep_history: bool) -> dict[str, object]:
    """job_finish_many's parameters. Every writer of outcomes builds them here: the completer,
    the rescuer, an atomic lane (also on a sync connection) and a stopping worker."""
    return _finish_params(
        "{" + ",".join([f'"{o.job.id}":{o.as_json()}' for o in outcomes]) + "}",
        [o.job.id for o in outcomes],
        [o.job.id for o in outcomes if o.status == "retry"],
        keep_history,
        # Jobs of the unkeyed claim hold no key's slot: a batch of only those locks none.
        keyed=not all(o.job.unkeyed for o in outcomes),
    )


def finish_rows_params(
    rows: Sequence[Mapping[str, object]], *, keep_history: bool = True, keyed: bool = True
) -> dict[str, object]:
    """job_finish_many's parameters from outcomes given as plain objects (each with id,
    attempt, worker_id and status, and any of duration, error, result, retry_in, snooze
    and progress): for code that writes outcomes without a worker, as tools and tests do."""
    ids = [_row_id(row) for row in rows]
    return _finish_params(
        encode_json({str(i): row for i, row in zip(ids, rows, strict=True)}),
        ids,
        [i for i, row in zip(ids, rows, strict=True) if row["status"] == "retry"],
        keep_history,
        keyed=keyed,
    )


def _finish_params(
    outcomes: str, ids: Sequence[int], retries: Sequence[int], keep_history: bool, *, keyed: bool
) -> dict[str, object]:
    """The outcomes as one JSON object keyed by id, and beside it the ids and those of the
    retries: the statement reads each job's outcome by key and builds nothing from them."""
    return {
        "outcomes": outcomes,
        "ids": _bigints(ids),
        "retries": _bigints(retries),
        "keep_history": keep_history,
        "now": None,
        "keyed": keyed,
    }


def _row_id(row: Mapping[str, object]) -> int:
    job_id = row["id"]
    if not isinstance(job_id, int):
        raise TypeError(f"an outcome's id must be a job id (an int), not {job_id!r}")
    return job_id


def _bigints(values: Sequence[int]) -> str:
    """A bigint[] parameter as its text: one parameter type whatever the ids' sizes, where a
    list would be sent as smallint[], integer[] or bigint[] by its largest value, and each
    type would prepare the statement again."""
    return "{" + ",".join(map(str, values)) + "}"


class JobsStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def insert_jobs(
        self, conn: AsyncConn, jobs: Sequence[NewJob], now: datetime | None = None
    ) -> list[Enqueued]:
        """Insert jobs a worker makes itself (follow-ups, periodic ticks); their ids in order.
        `now` pins the clock their delays count from. Fair jobs are stamped first, in the
        caller's transaction."""
        vtimes = None
        if fairness.fair(jobs):
            vtimes = await run_async(conn, fairness.stamp_plan(jobs, self.schema), together=False)
        query_, params = insert(jobs, self.schema, vtimes=vtimes)
        return await fetch(conn, _inserted, query_, {**(params or {}), "now": now})

    async def claim_unkeyed(self, conn: AsyncConn, params: ClaimParams) -> Claimed | None:
        """job_claim_unkeyed: the claim of a queue whose jobs carry no concurrency key. None
        when it met a keyed job and claimed nothing: claim with claim_keyed from then on."""
        statement_ = statement("job_claim_unkeyed", self.schema)
        claimed = Claimed([], [])
        for row in await fetch(conn, _unkeyed_row, statement_, params.as_params()):
            if isinstance(row, ClaimedJob):
                claimed.jobs.append(row)
            elif row.keyed:
                return None
            else:
                claimed.snapshot = row
        return claimed

    async def claim_keyed(self, conn: AsyncConn, params: ClaimParams) -> Claimed:
        """job_claim: jobs that fit their key's limit are claimed, the others parked."""
        claimed, _ = await self._claim(conn, "job_claim", params)
        return claimed

    async def claim_rated(
        self, conn: AsyncConn, params: ClaimParams
    ) -> tuple[Claimed, float, float | None]:
        """job_claim_rated: job_claim within the queue's rate limit and its jobs' tasks' and
        keys'. The jobs (those put back count as parked); in how many seconds the queue's
        limit has room again (0: now); and in how many the first job put back falls due
        (None: none was)."""
        claimed, room = await self._claim(conn, "job_claim_rated", params)
        return claimed, room.room_in, room.back_in

    async def _claim(
        self, conn: AsyncConn, name: str, params: ClaimParams
    ) -> tuple[Claimed, RateRoom]:
        claimed = Claimed([], [])
        room = RateRoom(0.0, None)
        for row in await fetch(conn, _claim_row, statement(name, self.schema), params.as_params()):
            if isinstance(row, ClaimedJob):
                claimed.jobs.append(row)
            elif isinstance(row, Parked):
                claimed.parked.append((row.priority, row.id))
            elif isinstance(row, RateRoom):
                room = row
        return claimed, room

    async def promote_due(
        self, conn: AsyncConn, queues: Sequence[str], limit: int
    ) -> tuple[int, float | None]:
        """Due scheduled jobs of `queues` made queued, at most `limit`; and in how many seconds
        the next one falls due (None: none is scheduled; infinite for infinity)."""
        row = await fetch_one(
            conn,
            Promoted,
            query("job_promote_due", self.schema),
            {"queues": list(queues), "limit": limit, "now": None},
        )
        return row.promoted, row.next_due_in

    async def finish_many(
        self, conn: AsyncConn, outcomes: Sequence[OutcomeRow], keep_history: bool
    ) -> Finished:
        """Write outcomes: finished jobs move to history, retried ones back to the queue."""
        params = finish_params(outcomes, keep_history)
        return await fetch_one(conn, Finished, statement("job_finish_many", self.schema), params)

    async def release_many(self, conn: AsyncConn, ids: Sequence[int], worker_id: int) -> None:
        """Put a stopping worker's unfinished jobs back without spending an attempt."""
        await execute(
            conn, query("job_release_many", self.schema), {"ids": list(ids), "worker_id": worker_id}
        )

    async def release_orphans(
        self, conn: AsyncConn, worker_id: int, known: Sequence[int]
    ) -> list[int]:
        """Put back this worker's running jobs it does not know of (a claim whose reply a
        broken connection lost); returns their ids."""
        params = {"worker_id": worker_id, "known": list(known)}
        rows = await fetch(conn, JobId, query("job_release_orphans", self.schema), params)
        return [row.id for row in rows]

    async def cancel_requested(
        self, conn: AsyncConn, ids: Sequence[int], worker_id: int
    ) -> list[int]:
        """Those of this worker's running jobs `ids` whose cancellation was requested."""
        params = {"worker_id": worker_id, "ids": list(ids)}
        rows = await fetch(conn, JobId, query("job_list_cancel_requested", self.schema), params)
        return [row.id for row in rows]

    async def find_stranded(
        self, conn: AsyncConn, lease: timedelta, limit: int
    ) -> list[ClaimedJob]:
        """Running jobs of workers silent for longer than `lease`, locked for the caller's
        transaction."""
        return await fetch(
            conn,
            ClaimedJob,
            query("job_find_stranded", self.schema),
            {"lease": lease.total_seconds(), "limit": limit, "now": None},
        )

    async def sweep_find(
        self, conn: AsyncConn, queue: str, pages: tuple[int, int], hint: Position, limit: int
    ) -> SweepFound:
        """The queued jobs of `queue` at or before `hint` in the heap pages [lo, hi), and the
        table's pages now (job_sweep_find)."""
        params = {
            "queue": queue,
            "lo": f"({pages[0]},0)",
            "hi": f"({pages[1]},0)",
            "hint_priority": hint[0],
            "hint_id": hint[1],
            "limit": limit,
        }
        return await fetch_one(conn, SweepFound, query("job_sweep_find", self.schema), params)

    async def find_orphaned(self, conn: AsyncConn, limit: int) -> list[ClaimedJob]:
        """Running jobs whose worker row is gone, locked for the caller's transaction."""
        statement_ = query("job_find_orphaned", self.schema)
        return await fetch(conn, ClaimedJob, statement_, {"limit": limit})

    async def find_of_workers(
        self, conn: AsyncConn, workers: Sequence[int], limit: int
    ) -> list[ClaimedJob]:
        """Running jobs of `workers`, locked for the caller's transaction."""
        return await fetch(
            conn,
            ClaimedJob,
            query("job_find_of_workers", self.schema),
            {"workers": list(workers), "limit": limit},
        )

    async def fail_out_of_range(
        self, conn: AsyncConn, queues: Sequence[str], limit: int, keep_history: bool
    ) -> int:
        """Fail scheduled jobs of `queues` whose run_at is after year 9999; returns how many."""
        row = await fetch_one(
            conn,
            FailedOutOfRange,
            query("job_fail_out_of_range", self.schema),
            {"queues": list(queues), "limit": limit, "keep_history": keep_history, "now": None},
        )
        return row.failed
