"""Rate limits of tasks and concurrency keys inside shared queues: at most N jobs of a task (or
of a key) start in any window of the period, across every worker process, whatever queue
they are in. Jobs over the limit are put back as scheduled without spending an attempt, and
the queue's other jobs run meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import ConfigurationError, Queue, Worker
from pgqueue.migrate import apply
from pgqueue.models import RATE_START_MARGIN
from pgqueue.queries import migrations, query
from pgqueue.store.jobs import ClaimParams, JobsStore
from tests.apps import tasks as apps
from tests.conftest import (
    CEILING,
    FLOOR,
    clean_exit_logs,
    count,
    drop_schema,
    stop_worker_processes,
    wait_until,
    worker_in_thread,
    worker_process,
)
from tests.integration.test_rate_limits import (
    _most_in_any_window,
    handler_starts_of_a_limited_backlog,
)

# Run on each server CI tests against: rates are counted by the server's clock.
pytestmark = pytest.mark.each_server

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
# A limit counts the starts of its period and this margin back, and puts jobs back for a
# start's time plus both: the reach of its window.
M = RATE_START_MARGIN.total_seconds()


def _claim(dsn: str, schema: str, queue: str, limit: int, at: datetime) -> Any:
    """One job_claim_rated of `queue` at `at`, as a worker runs it."""
    params = ClaimParams(queue, FLOOR, CEILING, limit, 1, job_limits=True, now=at)

    async def claim() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await JobsStore(schema).claim_rated(conn, params)

    return asyncio.run(claim())


def _scheduled(conn: psycopg.Connection[Any], schema: str) -> list[tuple[str, float, int]]:
    rows = conn.execute(
        f"SELECT task, extract(epoch FROM run_at - %s)::float8, attempt"
        f' FROM "{schema}".jobs WHERE status = %s ORDER BY id',
        (T0, "scheduled"),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_set_list_and_remove_task_and_key_limits(queue: Queue) -> None:
    queue.set_rate_limit("sms", "5/s")
    queue.set_task_rate_limit(apps.noop, "10/m")
    queue.set_task_rate_limit("mail.send", 3, per=timedelta(seconds=2))
    queue.set_key_rate_limit("tenant-1", "100/h")
    queue.set_key_rate_limit(None, "2/s")
    limits = [(r.queue, r.task, r.key, r.max_starts, r.period) for r in queue.rate_limits()]
    assert limits == [
        ("sms", None, None, 5, 1.0),
        (None, "mail.send", None, 3, 2.0),
        (None, "noop", None, 10, 60.0),
        (None, None, "*", 2, 1.0),
        (None, None, "tenant-1", 100, 3600.0),
    ]
    queue.set_task_rate_limit("noop", None)
    queue.set_key_rate_limit(None, None)
    assert [(r.task, r.key) for r in queue.rate_limits() if r.queue is None] == [
        ("mail.send", None),
        (None, "tenant-1"),
    ]


@pytest.mark.parametrize(
    ("kind", "name", "limit", "per"),
    [
        ("task", "bad name", "1/s", None),
        ("task", 42, "1/s", None),
        ("task", "noop", 0, 1),
        ("task", "noop", "10/d", None),
        ("task", "noop", None, 5),
        ("key", "*", "1/s", None),
        ("key", "", "1/s", None),
        ("key", "k", 10, None),
    ],
)
def test_a_bad_task_or_key_limit_is_refused(
    queue: Queue, kind: str, name: Any, limit: Any, per: Any
) -> None:
    with pytest.raises(ConfigurationError):
        if kind == "task":
            queue.set_task_rate_limit(name, limit, per=per)
        else:
            queue.set_key_rate_limit(name, limit, per=per)
    assert queue.rate_limits() == []


def test_a_task_over_its_limit_is_put_back_and_the_queue_runs_on(
    queue: Queue, dsn: str, schema: str
) -> None:
    """A limit of 2 per 10 s: of five jobs of the task, the claim takes two and the other
    tasks' jobs behind them; the three left are put back, spread a window's reach (its
    period and the start margin) apart, with their attempts unspent."""
    queue.set_task_rate_limit(apps.noop, 2, per=10)
    queue.enqueue_many([apps.noop.with_options(queue="q").job() for _ in range(5)])
    queue.enqueue_many([apps.sleepy.with_options(queue="q").job(0.0) for _ in range(3)])
    claimed, room_in, back_in = _claim(dsn, schema, "q", 10, T0)
    assert sorted(j.task for j in claimed.jobs) == ["noop"] * 2 + ["sleepy"] * 3
    assert len(claimed.parked) == 3 and room_in == 0 and back_in == pytest.approx(10 + M)
    with psycopg.connect(dsn) as conn:
        scheduled = _scheduled(conn, schema)
        assert [(task, attempt) for task, _, attempt in scheduled] == [("noop", 0)] * 3
        assert [at for _, at, _ in scheduled] == pytest.approx([10 + M, 10 + M, 2 * (10 + M)])
        # The window is full until then: a job enqueued now goes after those put back.
        queue.enqueue(apps.noop.with_options(queue="q").job())
        claimed, _, back_in = _claim(dsn, schema, "q", 10, T0 + timedelta(seconds=1))
        assert claimed.jobs == [] and len(claimed.parked) == 1
        assert back_in == pytest.approx(2 * (10 + M) - 1)
        assert _scheduled(conn, schema)[-1][1] == pytest.approx(2 * (10 + M))
        # Then the first two are due (the promotion makes them queued): both start.
        due = T0 + timedelta(seconds=10) + RATE_START_MARGIN
        conn.execute(f'UPDATE "{schema}".jobs SET status = %s WHERE run_at <= %s', ("queued", due))
        conn.commit()
        claimed, _, back_in = _claim(dsn, schema, "q", 10, due)
        assert [j.task for j in claimed.jobs] == ["noop", "noop"] and back_in is None


def test_jobs_put_back_get_the_times_the_window_frees(queue: Queue, dsn: str, schema: str) -> None:
    """Starts at 0, 2 and 4 s fill a limit of 3 per 10 s: four jobs put back at 5 s get 10,
    12 and 14 s and the margin (as each start leaves the window's reach), then twice the
    reach, one place each."""
    queue.set_task_rate_limit(apps.noop, 3, per=10)
    for second in (0, 2, 4):
        queue.enqueue(apps.noop.with_options(queue="q").job())
        claimed, _, _ = _claim(dsn, schema, "q", 10, T0 + timedelta(seconds=second))
        assert len(claimed.jobs) == 1
    queue.enqueue_many([apps.noop.with_options(queue="q").job() for _ in range(4)])
    claimed, _, back_in = _claim(dsn, schema, "q", 10, T0 + timedelta(seconds=5))
    assert claimed.jobs == [] and back_in == pytest.approx(5 + M)
    with psycopg.connect(dsn) as conn:
        assert [at for _, at, _ in _scheduled(conn, schema)] == pytest.approx(
            [10 + M, 12 + M, 14 + M, 2 * (10 + M)]
        )


def test_an_upgraded_installation_keeps_its_limits_and_the_earlier_admit_still_answers(
    dsn: str,
) -> None:
    """A schema migrated before the start margin, with a task's window full (2 starts at 0 s
    of 2 per 10 s), upgraded by migrate: the window is kept; job_rate_admit called as an
    earlier worker calls it (no margin) puts a job back for when the claims' window frees,
    and the claim of this version for then and the margin."""
    schema = f"pgq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(query("migration_table_create", schema))
        for migration in migrations():
            if migration.name == "rate_start_margin":
                break
            conn.execute(migration.render(schema))
            conn.execute(
                query("migration_record", schema),
                {"version": migration.version, "name": migration.name},
            )
        conn.execute(
            f'INSERT INTO "{schema}".job_rate_limits (kind, name, max_starts, period, starts,'
            " counts) VALUES ('task', 'noop', 2, interval '10 s', ARRAY[%s::timestamptz], '{2}')",
            [T0],
        )
    queue = Queue(dsn, schema=schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            apply(conn, schema)
        job = queue.enqueue(apps.noop.with_options(queue="q").job())
        with psycopg.connect(dsn) as conn:  # rolled back: it only answers
            back_at = conn.execute(
                f'SELECT extract(epoch FROM back_at - %s)::float8 FROM "{schema}".job_rate_admit('
                "ARRAY[%s::bigint], ARRAY['noop'], ARRAY[NULL]::text[], %s)",
                [T0, job, T0 + timedelta(seconds=1)],
            ).fetchall()
            conn.rollback()
        assert back_at == [(10.0,)]
        claimed, _, back_in = _claim(dsn, schema, "q", 10, T0 + timedelta(seconds=1))
        assert claimed.jobs == [] and back_in == pytest.approx(9 + M)
        assert [(r.task, r.max_starts, r.period) for r in queue.rate_limits()] == [
            ("noop", 2, 10.0)
        ]
    finally:
        queue.close()
        drop_schema(dsn, schema)


def test_a_key_limit_and_the_default_give_each_key_its_own_window(
    queue: Queue, dsn: str, schema: str
) -> None:
    queue.set_key_rate_limit(None, 1, per=5)  # every key: one start per 5 s
    queue.set_key_rate_limit("big", 3, per=5)
    for key in ("a", "a", "b", "b", "big", "big", "big", "big"):
        queue.enqueue(apps.noop.with_options(queue="q", concurrency_key=key).job())
    queue.enqueue(apps.noop.with_options(queue="q").job())  # no key: no key limit
    claimed, _, back_in = _claim(dsn, schema, "q", 20, T0)
    with psycopg.connect(dsn) as conn:
        keys = conn.execute(
            f'SELECT concurrency_key, status FROM "{schema}".jobs ORDER BY id'
        ).fetchall()
    assert len(claimed.jobs) == 6 and back_in == pytest.approx(5 + M)
    assert [s for _, s in keys] == ["running", "scheduled"] * 2 + ["running"] * 3 + [
        "scheduled",
        "running",
    ]
    # The default is listed once; the keys' own windows under it are not limits of their own.
    assert [(r.key, r.max_starts) for r in queue.rate_limits()] == [("*", 1), ("big", 3)]


def test_task_and_key_limits_hold_across_worker_processes(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Three worker processes share a queue holding a task limited to 10 a second, a key
    limited to 5 a second, and unlimited jobs: the unlimited ones finish while the limited
    ones are still held, no window holds more starts than its limit, and no start spent an
    attempt on being put back."""
    task_limit, key_limit, period = 10, 5, 1.0
    queue = Queue(dsn, schema=schema)
    queue.migrate()
    queue.set_task_rate_limit(apps.noop, task_limit, per=period)
    queue.set_key_rate_limit("slow-tenant", key_limit, per=period)
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    args = ("--queues", "mixed", "--concurrency", "8", "--poll-interval", "0.5")
    procs = [worker_process(dsn, schema, *args, log=log) for log in logs]
    try:
        with psycopg.connect(dsn) as conn:
            wait_until(lambda: count(conn, schema, "workers") == 3, what="3 workers")
            conn.commit()
        jobs = [apps.noop.with_options(queue="mixed").job() for _ in range(50)]
        jobs += [
            apps.sleepy.with_options(queue="mixed", concurrency_key="slow-tenant").job(0.0)
            for _ in range(25)
        ]
        jobs += [apps.sleepy.with_options(queue="mixed").job(0.0) for _ in range(300)]
        queue.enqueue_many(jobs)
        with psycopg.connect(dsn) as conn:

            def done(where: str, n: int) -> bool:
                conn.commit()
                return count(conn, schema, "job_history", where) == n

            free = "task = 'sleepy' AND concurrency_key IS NULL"
            wait_until(lambda: done(free, 300), what="the unlimited jobs")
            assert count(conn, schema, "job_history", "task = 'noop'") < 50  # still held
            wait_until(lambda: done("task = 'noop'", 50), what="the rated task")
            wait_until(lambda: done("concurrency_key = 'slow-tenant'", 25), what="the rated key")
            rows = conn.execute(
                "SELECT task, concurrency_key, extract(epoch FROM started_at)::float8, attempt,"
                f' status FROM "{schema}".job_history'
            ).fetchall()
    finally:
        stop_worker_processes(procs)
        queue.close()
    clean_exit_logs(procs, logs)
    assert {(r[3], r[4]) for r in rows} == {(1, "succeeded")}
    task_starts = [r[2] for r in rows if r[0] == "noop"]
    key_starts = [r[2] for r in rows if r[1] == "slow-tenant"]
    assert _most_in_any_window(task_starts, period) <= task_limit
    assert _most_in_any_window(key_starts, period) <= key_limit
    # 50 starts at 10 a second take at least 4 s, 25 at 5 a second as long.
    assert max(task_starts) - min(task_starts) >= (50 // task_limit - 1) * period
    assert max(key_starts) - min(key_starts) >= (25 // key_limit - 1) * period


@pytest.mark.parametrize("task", [apps.stamp_start, apps.astamp_start], ids=["def", "async"])
def test_handler_starts_never_exceed_a_task_limit_in_any_window(
    dsn: str, schema: str, tmp_path: Path, task: Any
) -> None:
    """As for a queue's limit (test_rate_limits.py): each handler writes the time it started,
    and three worker processes drain a backlog of a task limited to 5 a second, in a queue
    of its own with no limit: no window of a second holds more than 5 of its handlers'
    starts, and none spent an attempt on being put back."""
    jobs = [task.with_options(queue="rated").job(dsn, schema) for _ in range(30)]
    starts = handler_starts_of_a_limited_backlog(
        dsn, schema, tmp_path, lambda q: q.set_task_rate_limit(task, 5, per=1), jobs
    )
    assert _most_in_any_window(starts, 1.0) <= 5


@pytest.mark.parametrize("task", [apps.stamp_start, apps.astamp_start], ids=["def", "async"])
def test_handler_starts_never_exceed_a_key_limit_in_any_window(
    dsn: str, schema: str, tmp_path: Path, task: Any
) -> None:
    """The same for a key limited to 5 a second: its jobs' handlers never start more than 5
    times in any window of a second, and none spent an attempt on being put back."""
    key = "slow-tenant"
    jobs = [
        task.with_options(queue="rated", concurrency_key=key).job(dsn, schema) for _ in range(30)
    ]
    starts = handler_starts_of_a_limited_backlog(
        dsn, schema, tmp_path, lambda q: q.set_key_rate_limit(key, 5, per=1), jobs
    )
    assert _most_in_any_window(starts, 1.0) <= 5


def test_a_running_worker_hears_of_a_task_limit_and_only_that_task_s_queue_pays_for_it(
    dsn: str, schema: str
) -> None:
    """The limit is set after the worker started (it hears of it at commit). The queue where
    the limited task's jobs are switches to the rated claim; the queue that never holds one
    keeps the plain claim."""
    queue = Queue(dsn, schema=schema)
    worker = Worker(
        apps.queue, dsn=dsn, schema=schema, queues=["plain", "mixed"], poll_interval=0.05
    )
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims >= 2, what="the worker's first claims")
        queue.set_task_rate_limit(apps.noop, 4, per=2)
        wait_until(
            lambda: worker.current.claimer.controls.limited_tasks == {"noop"},
            what="the worker to hear",
        )
        queue.enqueue_many([apps.sleepy.with_options(queue="plain").job(0.0) for _ in range(20)])
        queue.enqueue_many([apps.noop.with_options(queue="mixed").job() for _ in range(6)])
        with psycopg.connect(dsn) as conn:

            def done(where: str) -> int:
                conn.commit()
                return count(conn, schema, "job_history", where)

            wait_until(lambda: done("queue = 'plain'") == 20, what="the plain queue")
            wait_until(lambda: done("task = 'noop'") == 4, what="the first window's worth")
            assert worker.current.claimer.statement.keyed == {"mixed"}
            # The other two were put back for the next window, and run then.
            wait_until(lambda: done("task = 'noop'") == 6, what="the jobs put back", timeout=10)
            rows = conn.execute(
                "SELECT extract(epoch FROM started_at)::float8, attempt"
                f' FROM "{schema}".job_history WHERE task = %s',
                ["noop"],
            ).fetchall()
    queue.close()
    assert _most_in_any_window([r[0] for r in rows], 2.0) <= 4
    assert {r[1] for r in rows} == {1}
