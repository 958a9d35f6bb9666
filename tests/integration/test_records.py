"""Job records: get_job across the hot table and history, list_jobs with filters and pages."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from pgqueue import ConfigurationError, JobStatus, Queue, RetryPolicy
from pgqueue.queries import query
from pgqueue.testing import drain

# Run on each server CI tests against: job records are read through the server's plans.
pytestmark = pytest.mark.each_server


def test_a_job_record_follows_the_job_from_queued_to_succeeded(queue: Queue) -> None:
    t = queue.task(name="t", queue="reports")(lambda n: {"rows": n})
    job_id = t.enqueue(3)
    queued = queue.get_job(job_id)
    assert queued is not None and queued.status is JobStatus.QUEUED
    assert queued.attempt == 0 and queued.started_at is None and queued.wait_time is None
    assert not queued.finished
    drain(queue, queues=["reports"])
    done = queue.get_job(job_id)
    assert done is not None and done.status is JobStatus.SUCCEEDED and done.finished
    assert done.result == {"rows": 3} and done.args == {"n": 3} and done.queue == "reports"
    assert done.attempt == 1 and done.worker_id is not None and done.last_error is None
    assert done.started_at is not None and done.finished_at is not None
    assert done.wait_time is not None and done.wait_time >= timedelta(0)
    assert done.run_time is not None and done.run_time >= timedelta(0)
    shown = json.loads(done.model_dump_json())
    assert {"wait_time", "run_time", "last_error"} <= set(shown)


def test_a_failed_job_keeps_every_attempts_error(queue: Queue) -> None:
    @queue.task(name="boom", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    def boom() -> None:
        raise ValueError("no such report")

    job_id = boom.enqueue()
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 2
    assert [e["attempt"] for e in job.errors] == [1, 2]
    assert job.last_error == "ValueError: no such report"


def test_an_unknown_id_has_no_record(queue: Queue) -> None:
    assert queue.get_job(987654321) is None


@pytest.fixture
def mixed(queue: Queue) -> dict[str, list[int]]:
    """3 succeeded on `a`, 2 queued on `a`, 2 queued on `b` (task t2), 1 scheduled on `a`."""
    t1 = queue.task(name="t1", queue="a")(lambda: None)
    t2 = queue.task(name="t2", queue="b")(lambda: None)
    done = [t1.enqueue() for _ in range(3)]
    drain(queue, queues=["a"])
    live_a = [t1.enqueue() for _ in range(2)]
    live_b = [t2.enqueue() for _ in range(2)]
    later = [t1.with_options(delay=3600).enqueue()]
    return {"done": done, "live_a": live_a, "live_b": live_b, "later": later}


def _ids(page: Any) -> list[int]:
    return [job.id for job in page.jobs]


def test_list_jobs_filters_by_queue_task_and_status(
    queue: Queue, mixed: dict[str, list[int]]
) -> None:
    everything = sorted((i for ids in mixed.values() for i in ids), reverse=True)
    assert _ids(queue.list_jobs()) == everything
    assert _ids(queue.list_jobs(queue="b")) == sorted(mixed["live_b"], reverse=True)
    assert _ids(queue.list_jobs(task="t1", status="queued")) == sorted(
        mixed["live_a"], reverse=True
    )
    assert _ids(queue.list_jobs(status=["succeeded", "scheduled"])) == sorted(
        mixed["done"] + mixed["later"], reverse=True
    )
    assert _ids(queue.list_jobs(status=JobStatus.FAILED)) == []


def test_list_jobs_filters_by_creation_time(
    queue: Queue, mixed: dict[str, list[int]], dsn: str, schema: str
) -> None:
    old = mixed["done"][0]
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".job_history SET created_at = now() - interval '2 days' "
            "WHERE id = %s",
            [old],
        )
    since = datetime.now(timezone.utc) - timedelta(days=1)
    assert old not in _ids(queue.list_jobs(created_after=since))
    assert _ids(queue.list_jobs(created_before=since)) == [old]


def test_pages_walk_every_job_once_newest_first(queue: Queue, mixed: dict[str, list[int]]) -> None:
    seen: list[int] = []
    page = queue.list_jobs(limit=3)
    while True:
        seen += _ids(page)
        if page.next_before_id is None:
            break
        page = queue.list_jobs(limit=3, before_id=page.next_before_id)
    assert seen == sorted((i for ids in mixed.values() for i in ids), reverse=True)


def test_a_live_only_listing_never_reads_history(queue: Queue, dsn: str, schema: str) -> None:
    params = {
        "before_id": None,
        "after_id": None,
        "queue": None,
        "task": None,
        "concurrency_key": None,
        "tag": None,
        "workflow": None,
        "statuses": ["queued", "running"],
        "created_after": None,
        "created_before": None,
        "limit": 50,
    }
    with psycopg.connect(dsn) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        statement = query("job_list", schema).as_string(conn)
        plan = conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) " + statement, params
        ).fetchone()
    assert plan is not None
    text = json.dumps(plan[0])
    history_scans = [  # every partition of it (sql/migrations/0016_history_partitions.sql)
        node
        for node in _nodes(plan[0][0]["Plan"])
        if node.get("Relation Name", "").startswith("job_history")
    ]
    assert all(node.get("Actual Loops", 0) == 0 for node in history_scans), text


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += _nodes(child)
    return found


@pytest.mark.parametrize(
    ("filters", "named"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 5000}, "limit"),
        ({"status": "done"}, "status"),
        ({"created_after": datetime(2026, 1, 1)}, "created_after"),
        ({"nope": 1}, "nope"),
    ],
)
def test_bad_filters_are_refused_naming_them(
    queue: Queue, filters: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        queue.list_jobs(**filters)


def test_list_jobs_filters_by_tenant_live_and_finished(queue: Queue) -> None:
    t = queue.task(name="t")(lambda: None)
    acme = [t.with_options(concurrency_key="acme").enqueue() for _ in range(3)]
    other = t.with_options(concurrency_key="other").enqueue()
    drain(queue)
    live = t.with_options(concurrency_key="acme").enqueue()  # still queued
    page = queue.list_jobs(concurrency_key="acme")
    assert [job.id for job in page.jobs] == [live, *reversed(acme)]
    assert {job.concurrency_key for job in page.jobs} == {"acme"}
    assert [job.id for job in queue.list_jobs(concurrency_key="other").jobs] == [other]
    record = queue.get_job(other)
    assert record is not None and record.concurrency_key == "other"
