"""What happened to one attempt: the `Outcome` the executor returns and the completer writes.

Owns: an attempt's status (succeeded, failed, retry or cancelled) with its error, result,
retry delay and last progress report, and its form as one object of job_finish_many's JSON.
No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgqueue.codec import encode_json
from pgqueue.models import ClaimedJob

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
