"""Pausing a queue: no worker claims its jobs until it is resumed, running jobs finish, and
the pause is a row, so it holds across worker restarts and for every worker process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, ConfigurationError, Queue, Worker
from pgqueue.testing import drain
from pgqueue.worker.events import Bus, ControlsChanged, PauseChanged, Relistened
from pgqueue.worker.notifier import Notifier
from tests.apps import tasks as apps
from tests.conftest import (
    claimer_by_hand,
    clean_exit_logs,
    committed,
    count,
    stop_worker_processes,
    wait_until,
    worker_in_thread,
    worker_process,
)

# Run on each server CI tests against: pauses are read in the claim's statement.
pytestmark = pytest.mark.each_server

JOBS = 200


def test_pause_resume_and_list_say_what_changed(queue: Queue) -> None:
    assert queue.pause_queue("reports", reason="disk full") == ["reports"]
    assert queue.pause_queue(["reports", "emails", "emails"]) == ["emails"]
    paused = {p.queue: p for p in queue.paused_queues()}
    assert set(paused) == {"emails", "reports"}
    assert paused["reports"].reason == "" and paused["emails"].reason == ""
    assert paused["reports"].paused_at.tzinfo is not None
    assert queue.resume_queue(["reports", "never-paused"]) == ["reports"]
    assert [p.queue for p in queue.paused_queues()] == ["emails"]
    assert queue.resume_queue("emails") == ["emails"]
    assert queue.paused_queues() == []


@pytest.mark.parametrize("bad", ["", "has space", "x" * 200, []])
def test_a_bad_queue_name_is_refused_before_anything_is_written(queue: Queue, bad: object) -> None:
    with pytest.raises(ConfigurationError):
        queue.pause_queue(bad)  # type: ignore[arg-type]
    assert queue.paused_queues() == []


@pytest.mark.parametrize("reason", [None, "x" * 1001, "nul\x00"])
def test_a_bad_reason_is_refused(queue: Queue, reason: object) -> None:
    with pytest.raises(ConfigurationError, match="reason"):
        queue.pause_queue("default", reason=reason)  # type: ignore[arg-type]
    assert queue.paused_queues() == []


def test_a_pause_in_the_callers_transaction_takes_effect_at_its_commit(
    queue: Queue, dsn: str
) -> None:
    with psycopg.connect(dsn) as conn:
        queue.pause_queue("default", conn=conn)
        assert queue.paused_queues() == []  # not committed yet: other sessions do not see it
        conn.rollback()
    assert queue.paused_queues() == []


def test_the_async_twin_pauses_and_resumes(dsn: str, schema: str) -> None:
    async def main() -> list[list[str]]:
        aqueue = AsyncQueue(dsn, schema=schema)
        try:
            return [
                await aqueue.pause_queue("default"),
                [p.queue for p in await aqueue.paused_queues()],
                await aqueue.resume_queue("default"),
            ]
        finally:
            await aqueue.close()

    assert asyncio.run(main()) == [["default"], ["default"], ["default"]]


def test_a_paused_queue_keeps_lease_and_atomic_jobs_queued_across_worker_runs(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    queue.pause_queue("default", reason="maintenance")
    ids = queue.enqueue_many([apps.noop.job() for _ in range(5)])
    table = f"pause_effect_{schema}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (job_id bigint, pid integer)')
    marker = tmp_path / "marker"
    marker.touch()  # the task hangs on a first run without it
    try:
        ids.append(queue.enqueue(apps.atomic_effect.job(table, str(marker))))
        other = queue.enqueue(apps.noop.with_options(queue="other").job())
        for _ in range(2):  # a second worker run: the pause is the table's, not the worker's
            drain(apps.queue, dsn=dsn, schema=schema, queues=("default", "other"))
        jobs = [queue.get_job(i) for i in ids]
        assert all(job is not None and job.status.value == "queued" for job in jobs)
        done = queue.get_job(other)
        assert done is not None and done.status.value == "succeeded"

        assert queue.resume_queue("default") == ["default"]
        drain(apps.queue, dsn=dsn, schema=schema, queues=("default",))
        jobs = [queue.get_job(i) for i in ids]
        assert all(job is not None and job.status.value == "succeeded" for job in jobs)
        with psycopg.connect(dsn) as conn:
            assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (1,)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{table}"')


def test_a_running_job_finishes_when_its_queue_is_paused(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    first = queue.enqueue(apps.asleepy.job(0.5))
    worker = Worker(apps.queue, dsn=dsn, schema=schema, poll_interval=0.05)
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claimed >= 1, what="the first job claimed")
        queue.pause_queue("default")
        wait_until(lambda: "default" in worker.paused, what="the worker to hear of the pause")
        later = queue.enqueue(apps.asleepy.job(0))

        def finished() -> bool:
            job = queue.get_job(first)
            return job is not None and job.status.value == "succeeded"

        wait_until(finished, what="the running job to finish")
        time.sleep(0.3)  # several claim rounds at this poll interval
        job = queue.get_job(later)
        assert job is not None and job.status.value == "queued"
        queue.resume_queue("default")
        wait_until(lambda: worker.stats.claimed >= 2, what="the queued job after the resume")


def test_worker_processes_claim_nothing_of_a_paused_queue_and_each_job_once_after(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Two worker processes serve a paused queue and an open one: the open queue's jobs, enqueued
    after the paused ones, all finish while the paused ones wait; after the resume each paused
    job runs exactly once."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    queue = Queue(dsn, schema=schema)
    queue.pause_queue("held")
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    args = ("--queues", "held,open", "--concurrency", "4", "--poll-interval", "0.1")
    procs = [worker_process(dsn, schema, *args, log=log, env=env) for log in logs]
    try:
        with psycopg.connect(dsn) as conn:
            wait_until(
                lambda: committed(conn) and count(conn, schema, "workers") == 2, what="2 workers"
            )
            held = [apps.record.with_options(queue="held").job(i) for i in range(JOBS)]
            opened = [apps.record.with_options(queue="open").job(i) for i in range(JOBS, 2 * JOBS)]
            ids = queue.enqueue_many(held) + queue.enqueue_many(opened)

            def history(where: str) -> int:
                conn.commit()
                return count(conn, schema, "job_history", where)

            wait_until(lambda: history("queue = 'open'") == JOBS, what="the open queue drained")
            time.sleep(0.5)  # a few more claim rounds of both workers
            assert history("queue = 'held'") == 0
            assert count(conn, schema, "jobs", "queue = 'held' AND status = 'queued'") == JOBS

            assert queue.resume_queue("held") == ["held"]
            wait_until(lambda: history("queue = 'held'") == JOBS, what="the held queue drained")
    finally:
        stop_worker_processes(procs)
    for output in clean_exit_logs(procs, logs):
        assert "queue 'held' is paused" in output
    ran = Counter(i for i, _ in apps.read_runs(runs))
    assert sorted(ran) == sorted(ids) and set(ran.values()) == {1}


def test_after_a_resume_the_worker_claims_every_priority_at_once(dsn: str, schema: str) -> None:
    """Jobs enqueued while the queue was paused sit below where the worker's hint may be; the
    resume notice must send it back to the floor, not leave the jobs to the hint's safety net
    (an hour here)."""
    queue = Queue(dsn, schema=schema)
    worker = Worker(
        apps.queue, dsn=dsn, schema=schema, poll_interval=0.05, hint_reset_interval=3600
    )
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims >= 3, what="empty claims")
        queue.pause_queue("default")
        wait_until(lambda: "default" in worker.paused, what="the worker to hear of the pause")
        ids = [queue.enqueue(apps.noop.job(), priority=priority) for priority in (7, 3, 7, -2)]
        time.sleep(0.3)  # several poll intervals
        assert worker.stats.claimed == 0
        queue.resume_queue("default")

        def all_done() -> bool:
            jobs = [queue.get_job(i) for i in ids]
            return all(j is not None and j.status.value == "succeeded" for j in jobs)

        wait_until(all_done, timeout=10, what="every priority's job after the resume")


def test_a_paused_queue_costs_its_worker_no_claims(dsn: str, schema: str) -> None:
    """A worker leaves a paused queue out of its claim rounds: no claim statement runs for it,
    so a pause cannot slow the claims of the queues still running."""
    queue = Queue(dsn, schema=schema)
    queue.pause_queue("default")
    worker = Worker(apps.queue, dsn=dsn, schema=schema, poll_interval=0.02)
    with worker_in_thread(worker):
        wait_until(lambda: "default" in worker.paused, what="the pause read at start")
        time.sleep(0.3)
        assert worker.stats.claims == 0
        queue.resume_queue("default")
        wait_until(lambda: worker.stats.claims >= 1, what="claims after the resume")


@pytest.mark.parametrize("how", ["poll only", "listener lost"])
def test_a_worker_that_cannot_hear_the_notice_reads_the_pause(
    dsn: str, schema: str, how: str
) -> None:
    """Polling only (as behind PgBouncer), a worker learns of a pause within its poll interval;
    a listener that lost its connection reads the pauses again when it is back."""
    queue = Queue(dsn, schema=schema)
    worker = Worker(
        apps.queue,
        dsn=dsn,
        schema=schema,
        poll_interval=0.05,
        poll_only=how == "poll only",
        hint_reset_interval=3600,  # the safety-net read must not be what finds it
    )
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims >= 1, what="a first claim")
        if how == "listener lost":
            # Cut the listener off, then pause while it is away (it waits a second before it
            # reconnects): the notice is missed.
            with psycopg.connect(dsn, autocommit=True) as conn:
                listener = (
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE application_name = 'pgqueue:listen' AND datname = current_database()"
                )
                wait_until(lambda: conn.execute(listener).fetchone(), what="the listener")
                conn.execute(f"SELECT pg_terminate_backend(pid) FROM ({listener}) AS l")
        queue.pause_queue("default")
        wait_until(lambda: "default" in worker.paused, timeout=10, what="the pause read")
        queue.resume_queue("default")
        wait_until(lambda: "default" not in worker.paused, timeout=10, what="the resume read")


@pytest.mark.parametrize("notice", ["pause", "rate limit"])
def test_a_notice_heard_while_the_controls_are_read_is_not_undone_by_that_read(
    dsn: str, schema: str, notice: str
) -> None:
    """A worker reads the pauses and rate limits now and then, and hears their notices in
    between. A notice that arrives while a read's answer is on its way (the read's snapshot
    predates the change) still holds afterwards: the read must not put back what it saw."""
    queue = Queue(dsn, schema=schema)

    async def scenario() -> tuple[set[str], set[str]]:
        events = Bus(asyncio.get_running_loop())
        notifier = Notifier(dsn, schema, {"default"}, events)
        heard: list[object] = []
        events.subscribe(PauseChanged, heard.append)
        events.subscribe(ControlsChanged, heard.append)
        listening = asyncio.Event()
        events.subscribe(Relistened, lambda e: listening.set())
        task = asyncio.create_task(notifier.loop())
        try:
            await asyncio.wait_for(listening.wait(), 30)
            async with claimer_by_hand(dsn, schema, steady=False) as (claimer, _):
                claimer.subscribe(events)
                link = claimer.link
                real_run = link.run

                async def read_then_change(fn: Any) -> Any:
                    # The read's answer is in hand; the change commits and its notice is
                    # heard before the claimer gets that answer.
                    answer = await real_run(fn)
                    link.run = real_run  # type: ignore[method-assign]
                    if notice == "pause":
                        queue.pause_queue("default")
                    else:
                        queue.set_rate_limit("default", 1000, per=1)
                    deadline = time.monotonic() + 30
                    while not heard and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    assert heard, "the notice was not heard"
                    return answer

                link.run = read_then_change  # type: ignore[method-assign,assignment]
                await claimer.claim_round(10)  # reads the controls, hears the notice meanwhile
                await claimer.claim_round(10)
                return set(claimer.controls.paused), set(claimer.controls.rated)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await notifier.close()

    paused, rated = asyncio.run(scenario())
    if notice == "pause":
        assert paused == {"default"}
    else:
        assert rated == {"default"}
