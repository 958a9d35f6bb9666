"""What a finished job means to whoever waits for it, and the waits built on the hub.

Owns: `JobOutcome` (a finished job's result, or the error it stands for), the decoding of a
job's record into one, and `wait`, `wait_many` and `as_completed` as coroutines over a
`Waiters` hub (pgqueue/queue/waiting.py), which Queue runs on its hub's thread and AsyncQueue on
the caller's loop: the twins wait through this code alone.

Guarantees:
- A succeeded job gives its result as stored (the handler's return value as JSON); a failed
  one raises JobFailedError with its recorded error; a cancelled one JobCancelledError.
- A job that is neither live nor in history raises JobNotFoundError: it never existed (or
  its enqueue has not committed yet), it finished under keep_history=False, or its history
  was pruned. A Queue with keep_history=False refuses to wait at all.
- A timeout raises WaitTimeoutError and leaves the job running.
- A workflow's wait returns once every one of its jobs has finished, whether it succeeded,
  failed or was cancelled (a job cancelled because what it waited for failed included).
- `wait_many` is `asyncio.gather` for jobs: results in the order given, the first failure (in
  the order the jobs finish) raised at once unless `return_exceptions`, where it takes its
  job's place in the list. `as_completed` yields each job's outcome as it finishes, and
  raises its own errors (timeout, not found) but never a job's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pgqueue.errors import (
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    PgQueueError,
    WaitTimeoutError,
)
from pgqueue.models import EnqueuedWorkflow, Job, JobStatus, Workflow, duration
from pgqueue.queue.waiting import Waiters
from pgqueue.store.waits import JobEnd

JobHandle = int | Job  # a job id (what enqueue returns is one) or a job's record
WorkflowHandle = int | EnqueuedWorkflow | Workflow


@dataclass(frozen=True)
class JobOutcome:
    """How a job finished: `status` succeeded with its `result`, or failed or cancelled with
    the `error` that wait() would raise for it."""

    job_id: int
    status: JobStatus
    result: Any = None
    error: JobFailedError | JobCancelledError | None = None

    def get(self) -> Any:
        """The job's result; raises its error if it failed or was cancelled."""
        if self.error is not None:
            raise self.error
        return self.result


def outcome(end: JobEnd) -> JobOutcome:
    """The outcome a job's final record stands for; JobNotFoundError when there is none."""
    if end.status is None:
        raise JobNotFoundError(
            f"job {end.id} is neither live nor in history: it never existed, its enqueue has "
            "not committed yet, or it finished with keep_history=False or its history was "
            "pruned; waiting for a result needs the job's history"
        )
    status = JobStatus(end.status)
    if status is JobStatus.FAILED:
        return JobOutcome(end.id, status, error=JobFailedError(end.id, end.errors))
    if status is JobStatus.CANCELLED:
        return JobOutcome(end.id, status, error=JobCancelledError(end.id))
    return JobOutcome(end.id, status, result=end.result)


def checked_job_id(value: object) -> int:
    """A job id as the API takes it: a whole number that a bigint column can hold."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise ConfigurationError(
            f"job ids are whole numbers from 1 to 2**63-1 (as enqueue returns them), got {value!r}"
        )
    return value


def job_ids(jobs: JobHandle | Iterable[JobHandle]) -> list[int]:
    """Job ids as the waits take them: ids (what enqueue returns) or records, checked."""
    many = [jobs] if isinstance(jobs, (int, Job)) else list(jobs)
    return [checked_job_id(job.id if isinstance(job, Job) else job) for job in many]


def seconds(timeout: timedelta | float | None) -> float | None:
    """A wait's timeout in seconds; None waits as long as it takes."""
    span = duration(timeout, "timeout")
    if span is None:
        return None
    if span <= timedelta(0):
        raise ConfigurationError(
            f"timeout={timeout!r}: give a time greater than 0 seconds, or None to wait as "
            "long as the job takes"
        )
    return span.total_seconds()


async def wait(hub: Waiters, job: JobHandle, timeout: float | None) -> Any:
    """The job's result, or its error; see the module's guarantees."""
    (job_id,) = job_ids(job)
    try:
        end = await asyncio.wait_for(hub.end(job_id), timeout)
    except asyncio.TimeoutError:
        raise WaitTimeoutError([job_id], timeout or 0.0) from None
    return outcome(end).get()


async def wait_many(
    hub: Waiters, jobs: Iterable[JobHandle], timeout: float | None, return_exceptions: bool
) -> list[Any]:
    """Each job's result, in the order given; see the module's guarantees."""
    ids = job_ids(jobs)
    found: dict[int, Any] = {}
    async for end in _ends(hub, ids, timeout):
        try:
            found[end.id] = outcome(end).get()
        except PgQueueError as error:
            if not return_exceptions:
                raise
            found[end.id] = error
    return [found[job_id] for job_id in ids]


async def as_completed(
    hub: Waiters, jobs: Iterable[JobHandle], timeout: float | None
) -> AsyncIterator[JobOutcome]:
    """Each job's outcome as it finishes; a job given twice comes once."""
    async for end in _ends(hub, job_ids(jobs), timeout):
        yield outcome(end)


async def wait_all(hub: Waiters, ids: list[int], timeout: float | None) -> None:
    """Return once every job has finished, however it finished (a workflow's wait)."""
    async for _ in _ends(hub, ids, timeout):
        pass


def workflow_job_ids(workflow: WorkflowHandle) -> list[int] | None:
    """The jobs of a workflow given by its record, its enqueue's result, or None for an id
    (read from the database first)."""
    if isinstance(workflow, Workflow):
        return [job.id for job in workflow.jobs]
    if isinstance(workflow, EnqueuedWorkflow):
        return list(workflow.job_ids)
    if isinstance(workflow, bool) or not isinstance(workflow, int):
        raise ConfigurationError(
            "wait_workflow takes a workflow's id, what enqueue_workflow returned, or a "
            f"Workflow; got {type(workflow).__name__}"
        )
    return None


async def _ends(hub: Waiters, ids: list[int], timeout: float | None) -> AsyncIterator[JobEnd]:
    """Each job's final record as it finishes (those finishing together in the order given);
    WaitTimeoutError naming the rest at the deadline."""
    order = {job_id: at for at, job_id in enumerate(dict.fromkeys(ids))}
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = {asyncio.ensure_future(hub.end(job_id)): job_id for job_id in order}
    try:
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            done, _ = await asyncio.wait(pending, timeout=left, return_when="FIRST_COMPLETED")
            if not done:
                raise WaitTimeoutError(
                    sorted(pending.values(), key=lambda i: order[i]), timeout or 0.0
                )
            for task in sorted(done, key=lambda t: order[pending[t]]):
                del pending[task]
                yield task.result()
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
