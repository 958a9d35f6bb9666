"""Workflows: chain, group, chord and jobs that wait for other jobs, in one worker. The
several-process races are in test_workflows_processes.py."""

from __future__ import annotations

import psycopg
import pytest

from pgqueue import (
    ConfigurationError,
    InvalidArgumentsError,
    JobNotFoundError,
    JobStateError,
    JobStatus,
    Queue,
    RetryPolicy,
    chain,
    chord,
    group,
)
from pgqueue.testing import drain
from tests.conftest import count


def _app(dsn: str, schema: str) -> Queue:
    queue = Queue(dsn, schema=schema)

    @queue.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="double")
    def double(x: int) -> int:
        return 2 * x

    @queue.task(name="total")
    def total(values: list[int | None], offset: int = 0) -> int:
        return sum(v or 0 for v in values) + offset

    @queue.task(name="boom", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    def boom(x: int) -> int:
        raise RuntimeError(f"boom {x}")

    @queue.task(name="plain")
    def plain() -> str:
        return "plain"

    return queue


def _status(queue: Queue, job_id: int) -> JobStatus:
    job = queue.get_job(job_id)
    assert job is not None
    return job.status


def test_a_chain_passes_each_result_to_the_next_step(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    add, double = queue.registry.get("add"), queue.registry.get("double")
    flow = queue.enqueue_workflow(chain(add.job(2, 3), double.s(), double.s(), add.s(b=1)))
    ids = flow.job_ids
    assert flow.id == ids[0] and len(ids) == 4
    assert [_status(queue, i) for i in ids] == [JobStatus.QUEUED] + [JobStatus.BLOCKED] * 3
    drain(queue, dsn=dsn, schema=schema)
    jobs = [queue.get_job(i) for i in ids]
    assert [j.result for j in jobs if j] == [5, 10, 20, 21]
    assert jobs[1] is not None and jobs[1].args == {"x": 5}  # what it received, on record
    state = queue.get_workflow(flow.id)
    assert state is not None and state.finished and state.succeeded
    assert state.counts == {"succeeded": 4}
    assert [j.id for j in state.jobs] == ids


def test_a_chord_callback_gets_every_result_in_member_order(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    double, total = queue.registry.get("double"), queue.registry.get("total")
    members = [double.job(i) for i in range(20)]
    flow = queue.enqueue_workflow(chord(group(members), total.s(offset=1000)))
    callback = flow.job_ids[-1]
    drain(queue, dsn=dsn, schema=schema)
    job = queue.get_job(callback)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.args["values"] == [2 * i for i in range(20)]
    assert job.result == sum(2 * i for i in range(20)) + 1000


def test_a_step_after_a_group_gets_a_list_and_a_job_step_gets_nothing(
    dsn: str, schema: str
) -> None:
    queue = _app(dsn, schema)
    double, total, plain = (queue.registry.get(n) for n in ("double", "total", "plain"))
    flow = queue.enqueue_workflow(
        chain(group(double.job(1), double.job(2)), total.s(), plain.job(), group(plain.job()))
    )
    drain(queue, dsn=dsn, schema=schema)
    results = [queue.get_job(i) for i in flow.job_ids]
    assert [j.result for j in results if j] == [2, 4, 6, "plain", "plain"]
    assert results[3] is not None and results[3].args == {}


def test_a_failed_step_cancels_the_rest_of_its_chain_with_the_reason(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    boom, double = queue.registry.get("boom"), queue.registry.get("double")
    flow = queue.enqueue_workflow(chain(double.job(1), boom.s(), double.s(), double.s()))
    drain(queue, dsn=dsn, schema=schema)
    statuses = [_status(queue, i) for i in flow.job_ids]
    assert statuses == [
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
    ]
    third = queue.get_job(flow.job_ids[2])
    assert third is not None and third.attempt == 0
    assert third.last_error is not None and f"{flow.job_ids[1]} failed" in third.last_error
    fourth = queue.get_job(flow.job_ids[3])
    assert fourth is not None and fourth.last_error is not None
    assert f"{flow.job_ids[2]} cancelled" in fourth.last_error
    with psycopg.connect(dsn) as conn:  # nothing is left waiting
        assert count(conn, schema, "job_deps") == 0 and count(conn, schema, "job_waits") == 0


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_a_chord_runs_on_success_only_or_always(dsn: str, schema: str, on_failure: str) -> None:
    queue = _app(dsn, schema)
    double, boom, total = (queue.registry.get(n) for n in ("double", "boom", "total"))
    flow = queue.enqueue_workflow(
        chord([double.job(1), boom.job(0), double.job(3)], total.s(), on_failure=on_failure)  # type: ignore[arg-type]
    )
    drain(queue, dsn=dsn, schema=schema)
    callback = queue.get_job(flow.job_ids[-1])
    assert callback is not None
    if on_failure == "cancel":
        assert callback.status is JobStatus.CANCELLED
    else:
        assert callback.status is JobStatus.SUCCEEDED
        assert callback.args["values"] == [2, None, 6] and callback.result == 8


def test_cancelling_a_blocked_job_cancels_what_waits_for_it(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    double = queue.registry.get("double")
    flow = queue.enqueue_workflow(chain(double.job(1), double.s(), double.s()))
    assert queue.cancel_job(flow.job_ids[1]).value == "cancelled"
    assert _status(queue, flow.job_ids[2]) is JobStatus.CANCELLED
    drain(queue, dsn=dsn, schema=schema)
    assert _status(queue, flow.job_ids[0]) is JobStatus.SUCCEEDED


def test_a_job_can_wait_for_jobs_enqueued_before_it(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    double, total = queue.registry.get("double"), queue.registry.get("total")
    first = queue.enqueue(double.job(5))
    drain(queue, dsn=dsn, schema=schema)  # finished before the dependant exists
    second = queue.enqueue(double.job(7))  # live when it is enqueued
    flow = queue.enqueue_workflow(total.s(), after=[first, second])
    assert _status(queue, flow.id) is JobStatus.BLOCKED
    drain(queue, dsn=dsn, schema=schema)
    job = queue.get_job(flow.id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert job.args == {"values": [10, 14]} and job.result == 24
    second_job = queue.get_job(second)
    assert second_job is not None and second_job.workflow_id == flow.id


def test_waiting_for_a_failed_or_missing_job_is_refused(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    boom, total = queue.registry.get("boom"), queue.registry.get("total")
    failed = queue.enqueue(boom.job(1))
    drain(queue, dsn=dsn, schema=schema)
    with pytest.raises(JobStateError, match="already failed"):
        queue.enqueue_workflow(total.s(), after=[failed])
    with pytest.raises(JobNotFoundError):
        queue.enqueue_workflow(total.s(), after=[10**12])
    ran = queue.enqueue_workflow(total.s(), after=[failed], on_failure="run")
    drain(queue, dsn=dsn, schema=schema)
    job = queue.get_job(ran.id)
    assert job is not None and job.args == {"values": [None]} and job.result == 0


def test_a_rolled_back_workflow_leaves_nothing(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    double, total = queue.registry.get("double"), queue.registry.get("total")
    with psycopg.connect(dsn) as conn:
        flow = queue.enqueue_workflow(
            chord([double.job(i) for i in range(5)], total.s()), conn=conn
        )
        conn.rollback()
    assert queue.get_workflow(flow.id) is None
    with psycopg.connect(dsn) as conn:
        for table in ("jobs", "job_deps", "job_waits"):
            assert count(conn, schema, table) == 0


def test_bad_workflows_are_refused_before_anything_is_stored(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    add, double = queue.registry.get("add"), queue.registry.get("double")
    with pytest.raises(InvalidArgumentsError, match="no parameter free"):
        queue.enqueue_workflow(chain(double.job(1), add.s(1, 2)))
    with pytest.raises(InvalidArgumentsError):
        queue.enqueue_workflow(chain(double.job(1), add.s(a="x")))  # a is an int
    with pytest.raises(InvalidArgumentsError):
        queue.enqueue_workflow(double.s())  # nothing to receive: x is missing
    with pytest.raises(ConfigurationError):
        chain()
    with pytest.raises(ConfigurationError):
        chord([double.job(1)], double.s(), on_failure="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="dedupe_key"):
        queue.enqueue_workflow(chain(double.job(1), double.with_options(dedupe_key="k").s()))
    with pytest.raises(ConfigurationError):
        queue.enqueue_workflow("not a flow")  # type: ignore[arg-type]
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 0


def test_a_result_of_the_wrong_type_fails_the_step_that_receives_it(dsn: str, schema: str) -> None:
    """Typed validation of a received result happens when the step runs: the step fails with
    the reason, and the worker goes on."""
    queue = _app(dsn, schema)
    plain, double = queue.registry.get("plain"), queue.registry.get("double")
    flow = queue.enqueue_workflow(chain(plain.job(), double.s()))
    drain(queue, dsn=dsn, schema=schema)
    job = queue.get_job(flow.job_ids[1])
    assert job is not None and job.status is JobStatus.FAILED
    assert job.last_error is not None and "x" in job.last_error


def test_tags_filter_list_jobs(dsn: str, schema: str) -> None:
    queue = _app(dsn, schema)
    plain = queue.registry.get("plain")
    tagged = queue.enqueue(plain.job(), tags=["billing", "eu"])
    queue.enqueue(plain.job(), tags="billing")
    queue.enqueue(plain.job())
    assert [j.id for j in queue.list_jobs(tag="eu").jobs] == [tagged]
    assert len(queue.list_jobs(tag="billing").jobs) == 2
    drain(queue, dsn=dsn, schema=schema)
    assert [j.id for j in queue.list_jobs(tag="eu").jobs] == [tagged]  # history too
    job = queue.get_job(tagged)
    assert job is not None and job.tags == ["billing", "eu"]
    with pytest.raises(ConfigurationError):
        queue.enqueue(plain.job(), tags=["x" * 200])


def test_without_history_results_still_reach_the_callback(dsn: str, schema: str) -> None:
    """Results travel on the edges, not through history: a queue that keeps no history still
    passes them on, and what waits is still settled."""
    queue = Queue(dsn, schema=schema, keep_history=False)
    double = queue.task(name="double")(lambda x: 2 * x)
    total = queue.task(name="total")(lambda values: sum(values))
    flow = queue.enqueue_workflow(chord([double.job(i) for i in range(4)], total.s()))
    drain(queue, dsn=dsn, schema=schema)
    with psycopg.connect(dsn) as conn:
        for table in ("jobs", "job_history", "job_deps", "job_waits"):
            assert count(conn, schema, table) == 0, table
    assert queue.get_workflow(flow.id) is None  # nothing kept, as asked


def test_the_async_twin_enqueues_reads_and_limits(dsn: str, schema: str) -> None:
    import asyncio

    from pgqueue import AsyncQueue

    async def main() -> None:
        aqueue = AsyncQueue(dsn, schema=schema)
        double = aqueue.task(name="double")(lambda x: 2 * x)
        try:
            await aqueue.migrate()
            flow = await aqueue.enqueue_workflow(chain(double.job(1), double.s()))
            state = await aqueue.get_workflow(flow.id)
            assert state is not None and [j.status for j in state.jobs] == [
                JobStatus.QUEUED,
                JobStatus.BLOCKED,
            ]
            await aqueue.set_rate_limit("default", "5/s")
            assert [(r.queue, r.max_starts) for r in await aqueue.rate_limits()] == [("default", 5)]
            await aqueue.set_rate_limit("default", None)
            assert await aqueue.rate_limits() == []
        finally:
            await aqueue.close()

    asyncio.run(main())
