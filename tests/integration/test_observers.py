"""A worker's observers: told of every start, outcome and claim, and unable to harm a job."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pgqueue import Queue, RetryPolicy, Worker
from pgqueue.models import ClaimedJob


class Recording:
    def __init__(self) -> None:
        self.started: list[int] = []
        self.finished: list[tuple[int, str]] = []
        self.claims = 0

    def job_started(self, job: ClaimedJob) -> None:
        self.started.append(job.id)

    def job_finished(self, job: ClaimedJob, outcome: Any) -> None:
        self.finished.append((job.id, outcome.status))

    def claimed(self, seconds: float, jobs: int) -> None:
        self.claims += 1


class Broken:
    def job_started(self, job: ClaimedJob) -> None:
        raise RuntimeError("observer broke on start")

    def job_finished(self, job: ClaimedJob, outcome: Any) -> None:
        raise RuntimeError("observer broke on finish")

    def claimed(self, seconds: float, jobs: int) -> None:
        raise RuntimeError("observer broke on claim")


def test_an_observer_that_raises_is_logged_and_every_job_still_runs_and_is_recorded(
    queue: Queue, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    @queue.task(name="ok")
    def ok(n: int) -> int:
        return n

    @queue.task(name="bad", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    def bad() -> None:
        raise ValueError("no")

    ids = queue.enqueue_many([ok.job(n) for n in range(5)] + [bad.job()])
    recording = Recording()
    worker = Worker(queue, dsn=dsn, burst=True, observers=[Broken(), recording])
    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        worker.run()
    assert sorted(recording.started) == sorted([*ids[:5], ids[5], ids[5]])  # bad: 2 attempts
    assert sorted(s for i, s in recording.finished if i == ids[5]) == ["failed", "retry"]
    assert all(queue.get_job(i).status == "succeeded" for i in ids[:5])  # type: ignore[union-attr]
    assert recording.claims >= 2
    assert worker.tally.report()["outcomes"] == {"succeeded": 5, "retried": 1, "failed": 1}
    broke = [r.getMessage() for r in caplog.records if "observer" in r.getMessage()]
    assert any("failed on job" in m for m in broke) and any("on a claim" in m for m in broke)
