"""list_jobs on Citus, through the coordinator: a page of the newest jobs across every shard,
live and finished, with the plain queue's filters and paging."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import psycopg
import pytest
from psycopg import sql

from pgqueue.citus import CitusQueue, CitusWorker
from pgqueue.models import Job
from tests.citus import app
from tests.citus.conftest import values_on_two_nodes

pytestmark = pytest.mark.citus


def _every_page(queue: CitusQueue, limit: int) -> list[Job]:
    jobs: list[Job] = []
    before = None
    while True:
        page = queue.list_jobs(limit=limit, before_id=before)
        jobs.extend(page.jobs)
        if page.next_before_id is None:
            return jobs
        before = page.next_before_id


def test_list_jobs_pages_through_every_shard_newest_first_live_and_finished(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    with psycopg.connect(coordinator) as conn:
        tenants = [*values_on_two_nodes(conn, f"{citus_schema}.jobs"), "acme", "globex"]
    finished = queue.enqueue_many([app.record.job(tenant_id=t, n=1) for t in tenants])
    asyncio.run(
        CitusWorker(
            app.queue, dsn=coordinator, schema=citus_schema, burst=True, poll_interval=0.05
        ).run_async()
    )
    live = queue.enqueue_many([app.record.job(tenant_id=t, n=2) for t in tenants])
    listed = _every_page(queue, limit=3)
    assert [job.id for job in listed] == sorted(finished + live, reverse=True)
    assert {job.id: job.status for job in listed} == {
        **{i: "succeeded" for i in finished},
        **{i: "queued" for i in live},
    }


def test_list_jobs_filters_as_the_plain_queue_does(queue: CitusQueue) -> None:
    since = datetime.now(timezone.utc)
    tagged = queue.enqueue(app.record.with_options(tags=["vip"]).job(tenant_id="acme", n=1))
    keyed = queue.enqueue(
        app.record.with_options(concurrency_key="k1", queue="other").job(tenant_id="b", n=2)
    )
    failing = queue.enqueue(app.fail.job(tenant_id="acme"))
    assert [j.id for j in queue.list_jobs(tag="vip").jobs] == [tagged]
    assert [j.id for j in queue.list_jobs(concurrency_key="k1").jobs] == [keyed]
    assert [j.id for j in queue.list_jobs(queue="other").jobs] == [keyed]
    assert [j.id for j in queue.list_jobs(task="citus.fail").jobs] == [failing]
    assert [j.id for j in queue.list_jobs(status="succeeded").jobs] == []
    assert [j.id for j in queue.list_jobs(created_after=since, after_id=tagged).jobs] == [
        failing,
        keyed,
    ]
    assert queue.list_jobs(created_before=since).jobs == []


def test_list_jobs_lists_a_job_read_both_live_and_finished_once_as_finished(
    coordinator: str, citus_schema: str, queue: CitusQueue
) -> None:
    """What a read sees of a job that finishes between its read of the hot table and its
    read of history: the same id in both."""
    job_id = queue.enqueue(app.record.job(tenant_id="acme", n=1))
    with psycopg.connect(coordinator) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {schema}.job_history (shard, id, queue, task, args, status, priority,"
                " attempt, max_attempts, run_at, created_at, started_at, finished_at)"
                " SELECT shard, id, queue, task, args, 'succeeded', priority, 1, max_attempts,"
                " run_at, created_at, now(), now() FROM {schema}.jobs WHERE shard = 'acme'"
            ).format(schema=sql.Identifier(citus_schema))
        )
    page = queue.list_jobs()
    assert [(j.id, j.status) for j in page.jobs] == [(job_id, "succeeded")]
