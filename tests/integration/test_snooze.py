"""Snooze: a handler asks to run again later without using an attempt or recording an error."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgqueue import ConfigurationError, JobContext, JobStatus, Queue, Snooze
from pgqueue.testing import drain


def test_a_job_that_snoozes_runs_again_with_its_attempt_given_back(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    runs: list[int] = []

    @queue.task(max_attempts=1)
    def poll(ctx: JobContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise Snooze(0)
        if len(runs) == 2:
            return Snooze(timedelta(0))  # type: ignore[return-value]  # returning works too
        return "ready"

    job_id = queue.enqueue(poll.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED, job
    assert runs == [1, 1, 1]  # max_attempts=1, and it ran three times
    assert job.attempt == 1 and job.errors == [] and job.result == "ready"


def test_a_snoozed_job_waits_scheduled_for_its_time(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=1)
    async def later() -> None:
        raise Snooze(600)

    job_id = queue.enqueue(later.job())
    before = datetime.now(timezone.utc)
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.SCHEDULED, job
    assert job.attempt == 0 and job.errors == []
    assert before + timedelta(seconds=590) < job.run_at < before + timedelta(seconds=620)


def test_an_atomic_job_that_snoozes_keeps_none_of_its_writes(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    table = f"snooze_{schema}"

    @queue.task(atomic=True)
    def step(ctx: JobContext) -> None:
        assert ctx.connection is not None
        ctx.connection.execute(f'INSERT INTO "{table}" VALUES (1)')
        raise Snooze(300)

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (n int)')
    try:
        job_id = queue.enqueue(step.job())
        drain(queue, dsn=dsn)
        job = queue.get_job(job_id)
        assert job is not None and job.status is JobStatus.SCHEDULED and job.attempt == 0
        with psycopg.connect(dsn) as conn:
            assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')


@pytest.mark.parametrize("seconds", [-1, 1e12, float("nan"), "soon"])
def test_a_bad_snooze_fails_the_job_with_the_reason(dsn: str, schema: str, seconds: object) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(max_attempts=1)
    def bad() -> None:
        raise Snooze(seconds)  # type: ignore[arg-type]

    job_id = queue.enqueue(bad.job())
    drain(queue, dsn=dsn)
    job = queue.get_job(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    assert "Snooze" in job.errors[-1]["error"]


def test_snooze_refuses_what_no_wait_can_be() -> None:
    with pytest.raises(ConfigurationError, match="Snooze"):
        Snooze(-5)
    assert Snooze(1.5).seconds == 1.5
