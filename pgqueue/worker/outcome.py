"""What happened to one attempt: the `Outcome` the executor returns and the completer writes.

Owns: an attempt's status (succeeded, failed, retry or cancelled) with its error, result,
retry delay and last progress report, and its form as one object of job_finish_many's JSON;
the outcome of an attempt that failed, was snoozed, started late or was cancelled, with its
error's record (type, message, traceback) and its line in the `pgqueue.job` log. No other
I/O.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pgqueue.codec import encode_json
from pgqueue.models import RATE_START_MARGIN, ClaimedJob, RetryPolicy

log = logging.getLogger("pgqueue.job")
_TRACEBACK_LIMIT = 16_000

# A plain success as job_finish_many's JSON object, formatted directly: building a dict and
# encoding it stood out in a short job's profile. The keys it leaves out (error, result,
# retry_in, snooze, progress) the statement reads as null, as it reads them when they are
# null; the duration is given to the microsecond, what history keeps.
_SUCCEEDED_ROW = '{"id":%d,"attempt":%d,"worker_id":%d,"status":"succeeded","duration":%.6f}'


@dataclass(slots=True)
class Outcome:
    """What happened to one attempt; `status` is succeeded, failed, retry or cancelled.

    `duration` is None when nobody saw the attempt end (a rescued job): history then records
    the rescue time as its finish."""

    job: ClaimedJob
    status: str
    duration: float | None
    error: dict[str, Any] | None = None
    result: Any = None
    retry_in: float = 0.0
    snooze: bool = False  # a retry that gives its attempt back
    settled: bool = False  # already written by the handler's own statement (a parked job)
    progress: dict[str, Any] | None = None  # the last report, if the row may not have it

    def as_row(self) -> dict[str, Any]:
        return {
            "id": self.job.id,
            "attempt": self.job.attempt,
            "worker_id": self.job.worker_id,
            "status": self.status,
            "error": self.error,
            "result": self.result,
            "duration": self.duration,
            "retry_in": self.retry_in,
            "snooze": self.snooze,
            "progress": self.progress,
        }

    def as_json(self) -> str:
        """This outcome as job_finish_many's JSON object."""
        if (
            self.status == "succeeded"
            and self.result is None
            and self.progress is None
            and self.duration is not None
        ):
            job = self.job
            return _SUCCEEDED_ROW % (job.id, job.attempt, job.worker_id, self.duration)
        return encode_json(self.as_row())


def failed(
    job: ClaimedJob, exc: BaseException, duration: float, retry: RetryPolicy | None, kind: str
) -> Outcome:
    """An attempt that raised `exc` after `duration` seconds: retried under `retry` while
    attempts remain, failed for good without one (what retrying cannot mend)."""
    error = _error_record(job, exc, kind)
    if retry is not None and job.attempt < job.max_attempts:
        retry_in = retry.delay(job.attempt).total_seconds()
        log.warning(
            "job %s %s attempt %s/%s failed in %.1f ms, retrying in %.1f s: %s",
            job.id,
            job.task,
            job.attempt,
            job.max_attempts,
            duration * 1000,
            retry_in,
            error["error"],
        )
        return Outcome(job, "retry", duration, error=error, retry_in=retry_in)
    log.error(
        "job %s %s attempt %s/%s failed in %.1f ms, giving up: %s",
        job.id,
        job.task,
        job.attempt,
        job.max_attempts,
        duration * 1000,
        error["error"],
    )
    return Outcome(job, "failed", duration, error=error)


def snoozed(job: ClaimedJob, seconds: float, settled: bool, duration: float) -> Outcome:
    """A retry that gives its attempt back: a Snooze, a durable sleep, or a park for a
    signal (`settled`: the handler's own statement rescheduled the job)."""
    log.info(
        "job %s %s attempt %s %s",
        job.id,
        job.task,
        job.attempt,
        "parked until its signal" if settled else f"snoozed for {seconds:g} s",
    )
    return Outcome(job, "retry", duration, retry_in=seconds, snooze=True, settled=settled)


def late(job: ClaimedJob, duration: float) -> Outcome:
    """Put back, attempt unspent: the handler could not start by the time its rate
    limits (its queue's, task's or key's) count on (the worker's event loop or threads
    were busy)."""
    log.warning(
        "job %s %s could not start within %g s of its claim, as rate limits require: "
        "put back to run again",
        job.id,
        job.task,
        RATE_START_MARGIN.total_seconds(),
    )
    return Outcome(job, "retry", duration, retry_in=0.0, snooze=True)


def cancelled(job: ClaimedJob, duration: float | None) -> Outcome:
    """The outcome of an attempt stopped because its cancellation was requested."""
    error = {
        "attempt": job.attempt,
        "at": datetime.now(timezone.utc).isoformat(),
        "kind": "cancelled",
        "error": "cancelled on request",
        "traceback": "",
    }
    return Outcome(job, "cancelled", duration, error=error)


def _error_record(job: ClaimedJob, exc: BaseException, kind: str) -> dict[str, Any]:
    return {
        "attempt": job.attempt,
        "at": datetime.now(timezone.utc).isoformat(),
        "kind": kind,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "worker": job.worker_id,
        "error": describe(exc),
        "traceback": _traceback(exc),
    }


def describe(exc: BaseException) -> str:
    """`Type: message`, even when the exception's own str() raises."""
    name = type(exc).__qualname__
    try:
        text = str(exc)
    except Exception:
        text = "<str() of this exception raised>"
    text = text.replace("\x00", "\\x00")
    return f"{name}: {text}" if text else name


def _traceback(exc: BaseException) -> str:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        text = describe(exc)
    return text.replace("\x00", "\\x00")[-_TRACEBACK_LIMIT:]
