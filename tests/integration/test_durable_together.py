"""Durable jobs with the rest of pgqueue: workflows, pause, cancel, retention, rate limits
and tenants, with jobs that sleep or wait for a signal."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
from psycopg import sql

from pgqueue import Cancellation, JobContext, Queue, Worker, chain
from pgqueue.testing import drain
from tests.conftest import wait_until, worker_in_thread


def status(queue: Queue, job_id: int) -> str:
    job = queue.get_job(job_id)
    assert job is not None
    return job.status.value


def slept_past(queue: Queue, job_id: int) -> bool:
    """Whether the sleep the job is in has ended by the clock (it may not have run since)."""
    until = queue.job_steps(job_id).steps[-1].sleeps_until
    assert until is not None
    return datetime.now(timezone.utc) > until


def test_a_chain_s_next_job_starts_only_once_its_sleeping_job_finished(
    queue: Queue, dsn: str
) -> None:
    order: list[str] = []

    @queue.task(name="nap")
    def nap(ctx: JobContext) -> str:
        ctx.step("before", order.append, "before")
        ctx.sleep(timedelta(seconds=1))
        ctx.step("after", order.append, "after")
        return "rested"

    @queue.task(name="next")
    def next_one(previous: str) -> None:
        order.append(f"next got {previous}")

    flow = queue.enqueue_workflow(chain(nap.s(), next_one.s()))
    sleeper, follower = flow.job_ids
    drain(queue, dsn=dsn)
    assert status(queue, sleeper) == "scheduled" and order == ["before"]
    assert status(queue, follower) not in ("running", "succeeded")
    drain(queue, dsn=dsn)  # nothing due: the follower waits on the sleeper
    assert order == ["before"]
    wait_until(lambda: slept_past(queue, sleeper), what="the sleep to end")
    drain(queue, dsn=dsn)
    assert order == ["before", "after", "next got rested"]
    assert status(queue, follower) == "succeeded"


def test_a_sleeping_job_of_a_paused_queue_resumes_only_once_the_queue_does(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="paused.nap", queue="sleepy")
    def nap(ctx: JobContext) -> str:
        ctx.sleep(timedelta(seconds=1))
        return "done"

    job_id = nap.enqueue()
    drain(queue, dsn=dsn, queues=["sleepy"])
    assert status(queue, job_id) == "scheduled"
    queue.pause_queue("sleepy", reason="maintenance")
    wait_until(lambda: slept_past(queue, job_id), what="the sleep to end")
    drain(queue, dsn=dsn, queues=["sleepy"])
    assert status(queue, job_id) != "succeeded"  # due, but its queue is paused
    queue.resume_queue("sleepy")
    drain(queue, dsn=dsn, queues=["sleepy"])
    assert status(queue, job_id) == "succeeded"


def test_a_cancelled_waiting_job_stops_waiting_and_a_later_signal_goes_to_the_next_waiter(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="await.approval")
    def await_approval(ctx: JobContext) -> object:
        return ctx.wait_for_signal("approval", timeout=timedelta(days=1))

    first = await_approval.enqueue()
    drain(queue, dsn=dsn)
    assert queue.job_steps(first).waiting_for == "approval"
    assert queue.cancel_job(first) is Cancellation.CANCELLED
    assert status(queue, first) == "cancelled"
    assert queue.job_steps(first).waiting is None  # it waits no more
    queue.signal("approval", {"by": "ana"})  # finds no waiter: kept
    drain(queue, dsn=dsn)
    assert status(queue, first) == "cancelled" and queue.job_steps(first).steps == []
    second = await_approval.enqueue()
    drain(queue, dsn=dsn)  # takes the kept signal at once
    job = queue.get_job(second)
    assert job is not None and job.status.value == "succeeded" and job.result == {"by": "ana"}


def test_retention_prunes_the_wait_of_a_cancelled_parked_job_with_the_job(
    queue: Queue, dsn: str, schema: str
) -> None:
    from pgqueue.history.retention import Cutoff, prune

    @queue.task(name="parks")
    def parks(ctx: JobContext) -> None:
        ctx.step("first", lambda: 1)
        ctx.wait_for_signal("never")

    job_id = parks.enqueue()
    drain(queue, dsn=dsn)
    queue.cancel_job(job_id)
    assert len(queue.job_steps(job_id).steps) == 1  # in history, with its steps
    with psycopg.connect(dsn, autocommit=True) as conn:
        prune(conn, schema, Cutoff(timedelta(0)),
              now=datetime.now(timezone.utc) + timedelta(seconds=1))  # fmt: skip
        waits = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.signal_waits").format(sql.Identifier(schema))
        ).fetchone()
    assert queue.get_job(job_id) is None and queue.job_steps(job_id).steps == []
    assert waits == (0,)


def test_a_sleeping_job_holds_no_rate_room_while_asleep_and_its_wake_up_is_a_start(
    queue: Queue, dsn: str
) -> None:
    ran: list[str] = []

    @queue.task(name="limited")
    def limited(name: str, ctx: JobContext) -> None:
        ctx.step("start", ran.append, f"{name} started")
        if name == "sleeper":
            ctx.sleep(timedelta(seconds=1))
            ran.append("sleeper woke")

    queue.set_task_rate_limit(limited, 2, per=timedelta(hours=1))
    sleeper = limited.enqueue("sleeper")
    drain(queue, dsn=dsn)
    assert status(queue, sleeper) == "scheduled"
    other = limited.enqueue("other")
    drain(queue, dsn=dsn)  # the second start in the window: the sleeper holds no room
    assert status(queue, other) == "succeeded"
    wait_until(lambda: slept_past(queue, sleeper), what="the sleep to end")
    drain(queue, dsn=dsn)
    # Its wake-up is a third start within the hour: put back until the window has room.
    assert ran == ["sleeper started", "other started"]
    assert status(queue, sleeper) == "scheduled"


def test_a_tenant_s_sleeping_or_parked_job_frees_its_slot_for_the_tenant_s_next_job(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="tenant.work")
    def work(kind: str, ctx: JobContext) -> str:
        if kind == "sleep":
            ctx.sleep(timedelta(days=1))
        elif kind == "wait":
            ctx.wait_for_signal("tenant-go")
        return kind

    queue.set_concurrency_limit("acme", 1)
    acme = work.with_options(concurrency_key="acme")
    sleeper, waiter, plain = acme.enqueue("sleep"), acme.enqueue("wait"), acme.enqueue("plain")
    worker = Worker(queue, dsn=dsn, concurrency=3, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: status(queue, plain) == "succeeded", what="the tenant's third job")
        assert status(queue, sleeper) == "scheduled"
        assert status(queue, waiter) == "scheduled"
        queue.signal("tenant-go")
        wait_until(lambda: status(queue, waiter) == "succeeded", what="the woken job")
