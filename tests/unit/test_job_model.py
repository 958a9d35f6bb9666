"""What a job record says about its times."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from pgqueue import Job, JobStatus

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _job(**times: Any) -> Job:
    return Job(
        id=1,
        queue="default",
        task="t",
        args={},
        status=JobStatus.QUEUED,
        priority=0,
        attempt=1,
        max_attempts=3,
        finished_at=None,
        worker_id=None,
        errors=[],
        **times,
    )


def test_queue_wait_runs_from_the_later_of_creation_and_run_at_to_the_start() -> None:
    job = _job(
        created_at=T0, run_at=T0 + timedelta(seconds=5), started_at=T0 + timedelta(seconds=7)
    )
    assert job.wait_time == timedelta(seconds=2)


def test_a_job_waiting_for_its_retry_has_no_queue_wait_rather_than_a_negative_one() -> None:
    """run_at is then the next attempt's: the last attempt's own due time is gone."""
    job = _job(
        created_at=T0, run_at=T0 + timedelta(minutes=1), started_at=T0 + timedelta(seconds=1)
    )
    assert job.wait_time is None
