"""What a worker tells observers as it works: each job's start and outcome, and each claim.

Owns: the telling of the worker's observers (JobObserver, pgqueue/hooks.py), each shielded
from the others; the worker's own tally (WorkerTally, which its heartbeat
reports for the dashboard), what its claims did (WorkerStats, which testing.drain returns),
and the JSON log observer behind `pgqueue worker --log-format json`. Metrics
(pgqueue/metrics.py) and traces (pgqueue/tracing.py) are observers too.

Invariants: the worker calls job_started and job_finished for one job in the same asyncio task
(or the same thread, for a sync atomic job), so an observer may keep per-job context in a
context variable between the two. An observer that raises is logged and the job goes on: no
observer can fail a job or stop the worker. The worker's own tally is always there; each
other observer costs what it does, and none is there unless asked for.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

from pgqueue.hooks import AttemptOutcome, JobObserver, StepEvent, outcome_name
from pgqueue.models import ClaimedJob

if TYPE_CHECKING:
    from pgqueue.worker.outcome import Outcome

log = logging.getLogger("pgqueue.worker")


class Observers:
    """The worker's observers, each shielded from the others and from the job."""

    def __init__(self, observers: Sequence[JobObserver] = ()) -> None:
        self.all = list(observers)

    def job_started(self, job: ClaimedJob) -> None:
        for observer in self.all:
            try:
                observer.job_started(job)
            except Exception:
                log.exception("observer %r failed on job %s's start", observer, job.id)

    def job_finished(self, job: ClaimedJob, outcome: Outcome) -> None:
        for observer in self.all:
            try:
                observer.job_finished(job, outcome)
            except Exception:
                log.exception("observer %r failed on job %s's outcome", observer, job.id)

    def claimed(self, seconds: float, jobs: int) -> None:
        for observer in self.all:
            try:
                observer.claimed(seconds, jobs)
            except Exception:
                log.exception("observer %r failed on a claim", observer)

    def step_event(self, event: StepEvent) -> None:
        """Tell the observers that have a step_event method; the others are not asked."""
        for observer in self.all:
            told = getattr(observer, "step_event", None)
            if told is None:
                continue
            try:
                told(event)
            except Exception:
                log.exception("observer %r failed on job %s's step", observer, event.job.id)


RECENT_CLAIMS = 4096


@dataclass
class WorkerStats:
    """What a worker's claims did since it started (written by its claimer); what
    `pgqueue.testing.drain` returns."""

    claimed: int = 0
    claims: int = 0
    empty_claims: int = 0  # claim statements that found nothing to run or park
    unhinted_claims: int = 0
    promoted: int = 0
    started: float = field(default_factory=time.monotonic)
    # The most recent claim statements as (seconds, unhinted), newest last; readers may pop.
    recent_claims: deque[tuple[float, bool]] = field(
        default_factory=lambda: deque(maxlen=RECENT_CLAIMS)
    )

    def count_claim(self, seconds: float, jobs: int, walked: int, unhinted: bool) -> None:
        """One claim statement: it took `seconds`, got `jobs` to run and walked `walked`
        rows (run or parked), from the floor if `unhinted`."""
        self.recent_claims.append((seconds, unhinted))
        self.claims += 1
        self.unhinted_claims += unhinted
        self.claimed += jobs
        self.empty_claims += walked == 0


class WorkerTally:
    """Outcomes counted by this worker since it started, and its recent claim times; its
    heartbeat writes `report()` to its row, where the dashboard reads it."""

    RECENT = 256

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self._claims: list[float] = []
        self._lock = threading.Lock()  # sync atomic lanes count from their threads

    def job_started(self, job: ClaimedJob) -> None:
        pass

    def job_finished(self, job: ClaimedJob, outcome: AttemptOutcome) -> None:
        name = outcome_name(outcome)
        with self._lock:
            self.outcomes[name] += 1

    def claimed(self, seconds: float, jobs: int) -> None:
        self._claims.append(seconds)
        if len(self._claims) > 2 * self.RECENT:
            del self._claims[: self.RECENT]

    def report(self) -> dict[str, Any]:
        """A JSON object; read from the heartbeat's thread while the loop adds to it, so it
        copies before it reads."""
        recent = self._claims[-self.RECENT :]
        with self._lock:
            outcomes = dict(self.outcomes)
        return {
            "outcomes": outcomes,
            "claim_ms_p50": round(statistics.median(recent) * 1000, 3) if recent else None,
        }


class JsonLog:
    """One JSON line per job outcome on `stream` (stderr by default): what a log pipeline can
    index without parsing prose."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._started: dict[int, float] = {}

    def job_started(self, job: ClaimedJob) -> None:
        self._started[job.id] = time.monotonic()

    def job_finished(self, job: ClaimedJob, outcome: AttemptOutcome) -> None:
        self._started.pop(job.id, None)
        event: dict[str, Any] = {
            "at": datetime.now(timezone.utc).isoformat(),
            "event": "job." + outcome_name(outcome),
            "job_id": job.id,
            "task": job.task,
            "queue": job.queue,
            "attempt": job.attempt,
            "max_attempts": job.max_attempts,
            "worker_id": job.worker_id,
            "duration_seconds": outcome.duration,
        }
        if outcome.error is not None:
            event["error"] = outcome.error.get("error")
            event["error_type"] = outcome.error.get("type")
        if outcome.status == "retry":
            event["retry_in_seconds"] = outcome.retry_in
        stream = self.stream or sys.stderr
        stream.write(json.dumps(event, default=str) + "\n")
        stream.flush()

    def claimed(self, seconds: float, jobs: int) -> None:
        pass


class JsonFormatter(logging.Formatter):
    """The worker's other log records as JSON lines, beside JsonLog's job events; `fields`
    are added to every line (a supervised worker's `process`)."""

    def __init__(self, fields: dict[str, str] | None = None) -> None:
        super().__init__()
        self.fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "at": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        if record.exc_info:
            event["traceback"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str)
