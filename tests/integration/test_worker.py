"""Worker behaviour on a real database: order, scheduling, retries, history, bad rows."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from pgqueue import DatabaseError, JobContext, Queue, RetryPolicy, Worker
from pgqueue.errors import WorkerStateError
from pgqueue.testing import drain, enqueued_jobs
from tests.conftest import count, run_python, wait_until, worker_in_thread

NO_WAIT = RetryPolicy(base=0, jitter=0)


class Point(BaseModel):
    x: int
    y: int


def _insert_raw(
    conn: psycopg.Connection[Any], schema: str, task: str, args: str, max_attempts: int = 1
) -> int:
    """A job row written by other means than pgqueue (another service, psql, an old version)."""
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, max_attempts) "
            "VALUES ('default', %s, %s::jsonb, %s) RETURNING id"
        ).format(sql.Identifier(schema)),
        [task, args, max_attempts],
    ).fetchone()
    conn.commit()
    assert row is not None
    return int(row[0])


def test_worker_runs_jobs_in_priority_then_id_order(queue: Queue, conn: Any) -> None:
    order: list[str] = []

    @queue.task(name="t")
    def t(label: str) -> None:
        order.append(label)

    jobs = [t.job("p5-a"), t.job("p0-a"), t.job("p-3"), t.job("p0-b"), t.job("p5-b")]
    priorities = [5, 0, -3, 0, 5]
    for job, priority in zip(jobs, priorities, strict=False):
        queue.enqueue(job, conn=conn, priority=priority)
    conn.commit()
    drain(queue, concurrency=1)
    assert order == ["p-3", "p0-a", "p0-b", "p5-a", "p5-b"]


def test_worker_leaves_jobs_alone_until_their_run_at(queue: Queue, conn: Any, schema: str) -> None:
    ran: list[int] = []

    @queue.task(name="t")
    def t(i: int) -> None:
        ran.append(i)

    later = datetime.now(timezone.utc) + timedelta(hours=1)
    queue.enqueue(t.job(1), conn=conn, run_at=later)
    queue.enqueue(t.job(2), conn=conn, delay=timedelta(minutes=5))
    queue.enqueue(t.job(3), conn=conn)
    conn.commit()
    drain(queue)
    assert ran == [3]
    assert {j.status for j in enqueued_jobs(conn, queue)} == {"scheduled"}
    # Time passes: move the first job's run_at into the past instead of sleeping.
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET run_at = now() - interval '1 second' WHERE args->>'i' = '1'"
        ).format(sql.Identifier(schema))
    )
    conn.commit()
    drain(queue)
    assert ran == [3, 1]
    assert [j.args for j in enqueued_jobs(conn, queue)] == [{"i": 2}]


def test_failing_job_is_retried_then_failed_with_errors_and_timings(
    queue: Queue, conn: Any, schema: str
) -> None:
    attempts: list[int] = []

    @queue.task(name="flaky", max_attempts=3, retry=NO_WAIT)
    def flaky(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        raise RuntimeError(f"boom on attempt {ctx.attempt}")

    job_id = queue.enqueue(flaky.job(), conn=conn)
    conn.commit()
    drain(queue)
    assert attempts == [1, 2, 3]
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "failed" and job.attempt == 3
    assert [e["error"] for e in job.errors] == [
        f"RuntimeError: boom on attempt {n}" for n in (1, 2, 3)
    ]
    assert "Traceback" in job.errors[-1]["traceback"]
    assert job.started_at is not None and job.finished_at is not None
    assert job.created_at <= job.started_at <= job.finished_at
    assert job.run_time is not None and job.wait_time is not None
    assert count(conn, schema, "jobs") == 0


def test_retry_waits_for_its_backoff_before_running_again(queue: Queue, conn: Any) -> None:
    @queue.task(name="t", max_attempts=5, retry=RetryPolicy(base=3600, jitter=0))
    def t() -> None:
        raise ValueError("later")

    job_id = queue.enqueue(t.job(), conn=conn)
    conn.commit()
    drain(queue)
    (job,) = enqueued_jobs(conn, queue)
    assert job.id == job_id and job.status == "scheduled" and job.attempt == 1
    assert job.run_at - datetime.now(timezone.utc) > timedelta(minutes=55)
    assert job.last_error == "ValueError: later"


def test_succeeded_job_keeps_result_and_timings_in_history(queue: Queue, conn: Any) -> None:
    @queue.task(name="t")
    async def t(x: int) -> dict[str, int]:
        return {"double": 2 * x}

    job_id = queue.enqueue(t.job(21), conn=conn)
    conn.commit()
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "succeeded" and job.result == {"double": 42} and job.attempt == 1
    assert job.worker_id is not None and job.run_time is not None
    assert job.finished_at is not None and job.started_at is not None
    assert job.finished_at >= job.started_at


def test_history_off_deletes_finished_jobs(dsn: str, schema: str, conn: Any) -> None:
    queue = Queue(dsn, schema=schema, keep_history=False)
    t = queue.task(name="t")(lambda: None)
    queue.enqueue(t.job(), conn=conn)
    conn.commit()
    drain(queue)
    assert count(conn, schema, "jobs") == 0
    assert count(conn, schema, "job_history") == 0


def test_unregistered_task_row_fails_with_reason_and_worker_lives_on(
    queue: Queue, conn: Any, schema: str
) -> None:
    ran: list[int] = []

    @queue.task(name="ok")
    def ok(i: int) -> None:
        ran.append(i)

    bad = _insert_raw(conn, schema, "somebody.elses_task", '{"x": 1}')
    for i in range(5):
        queue.enqueue(ok.job(i), conn=conn)
    conn.commit()
    drain(queue, concurrency=2)
    assert sorted(ran) == [0, 1, 2, 3, 4]
    job = queue.get_job(bad)
    assert job is not None and job.status == "failed"
    assert "no task is registered under 'somebody.elses_task'" in (job.last_error or "")


def test_row_with_arguments_that_no_longer_validate_fails_without_retry(
    queue: Queue, conn: Any, schema: str
) -> None:
    @queue.task(name="t", max_attempts=10)
    def t(user_id: int) -> None: ...

    bad = _insert_raw(conn, schema, "t", json.dumps({"user_id": "abc"}), max_attempts=10)
    drain(queue)
    job = queue.get_job(bad)
    assert job is not None and job.status == "failed" and job.attempt == 1
    assert "stored arguments no longer validate" in (job.last_error or "")


def test_stored_json_is_parsed_back_to_declared_types(queue: Queue, conn: Any) -> None:
    seen: list[Any] = []

    @queue.task(name="t")
    def t(when: datetime, where: Point, tags: list[str], limit: int = 3) -> None:
        seen.extend([when, where, tags, limit])

    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    queue.enqueue(t.job(moment, Point(x=1, y=2), ["a"]), conn=conn)
    conn.commit()
    drain(queue)
    assert seen == [moment, Point(x=1, y=2), ["a"], 3]


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_handler_raising_exit_or_interrupt_fails_the_job_not_the_worker(
    queue: Queue, conn: Any, exc: BaseException
) -> None:
    ran: list[str] = []

    @queue.task(name="bad", max_attempts=1)
    def bad() -> None:
        raise exc

    @queue.task(name="abad", max_attempts=1)
    async def abad() -> None:
        raise exc

    @queue.task(name="good")
    def good() -> None:
        ran.append("good")

    ids = [queue.enqueue(bad.job(), conn=conn), queue.enqueue(abad.job(), conn=conn)]
    queue.enqueue(good.job(), conn=conn)
    conn.commit()
    drain(queue, concurrency=1)
    assert ran == ["good"]
    for job_id in ids:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "failed"
        assert (job.last_error or "").startswith(type(exc).__name__)


def test_sync_and_async_handlers_run_in_one_worker(queue: Queue, conn: Any) -> None:
    seen: list[str] = []

    @queue.task(name="s")
    def s(i: int) -> None:
        seen.append(f"s{i}")

    @queue.task(name="a")
    async def a(i: int) -> None:
        await asyncio.sleep(0)
        seen.append(f"a{i}")

    queue.enqueue_many([s.job(i) for i in range(20)] + [a.job(i) for i in range(20)], conn=conn)
    conn.commit()
    drain(queue, concurrency=8)
    assert sorted(seen) == sorted([f"s{i}" for i in range(20)] + [f"a{i}" for i in range(20)])


def test_worker_only_claims_its_own_queues(queue: Queue, conn: Any) -> None:
    ran: list[str] = []

    @queue.task(name="t")
    def t(q: str) -> None:
        ran.append(q)

    for name in ("a", "b", "c"):
        queue.enqueue(t.job(name), conn=conn, queue=name)
    conn.commit()
    drain(queue, queues=("a", "c"))
    assert sorted(ran) == ["a", "c"]
    assert [j.queue for j in enqueued_jobs(conn, queue)] == ["b"]


def test_session_settings_stay_on_the_workers_own_connections(queue: Queue, dsn: str) -> None:
    """Lease claims may commit without a WAL flush (worker/sessions.py); outcomes and
    atomic lanes, whose commits carry results and the handler's writes, may not. The claim and
    completer connections plan without sequential scans and JIT (session_prefer_indexes), and the
    claim connection runs its statements on their generic plans (session_generic_plans); an
    atomic lane runs the handler's own statements with the server's planner settings."""
    seen: dict[str, tuple[str, str]] = {}
    running: list[Worker] = []
    settings = (
        "SELECT current_setting('synchronous_commit'), current_setting('enable_seqscan')"
        " || '/' || current_setting('jit') || '/' || current_setting('plan_cache_mode')"
    )

    async def show(conn: Any) -> tuple[str, str]:
        cur = await conn.execute(settings)
        row = await cur.fetchone()
        return (str(row[0]), str(row[1]))

    @queue.task(name="lease")
    async def lease() -> None:
        worker = running[0]
        seen["claim"] = await worker.current.claim_link.run(show)
        seen["complete"] = await worker.current.completer.link.run(show)

    @queue.task(name="atomic_async", atomic=True)
    async def atomic_async(ctx: JobContext) -> None:
        seen["atomic_async"] = await show(ctx.connection)

    @queue.task(name="atomic_sync", atomic=True)
    def atomic_sync(ctx: JobContext) -> None:
        row = ctx.connection.execute(settings).fetchone()
        seen["atomic_sync"] = (str(row[0]), str(row[1]))

    queue.enqueue_many([lease.job(), atomic_async.job(), atomic_sync.job()])
    with psycopg.connect(dsn) as conn:
        row = conn.execute(settings).fetchone()
        assert row is not None
        default = (str(row[0]), str(row[1]))
    # the test means nothing on a server set otherwise
    assert default == ("on", "on/on/auto")
    running.append(Worker(queue, dsn=dsn, burst=True))
    asyncio.run(running[0].run_async())
    assert seen == {
        "claim": ("off", "off/off/force_generic_plan"),
        "complete": ("on", "off/off/auto"),
        "atomic_async": default,
        "atomic_sync": default,
    }


def _restartable(queue: Queue, dsn: str, schema: str) -> tuple[Worker, Any, list[tuple[int, int]]]:
    """A worker that claims only when woken (its poll is a minute away) and heartbeats
    often, and its task, whose handler records (argument, worker id) for each run."""
    runs: list[tuple[int, int]] = []

    @queue.task(name="seen")
    async def seen(i: int, ctx: JobContext) -> None:
        assert ctx.worker_id is not None
        runs.append((i, ctx.worker_id))

    worker = Worker(
        queue, dsn=dsn, schema=schema, poll_interval=60, heartbeat_interval=0.2, lease_timeout=30
    )
    return worker, seen, runs


def _serve_one_batch(
    queue: Queue,
    worker: Worker,
    seen: Any,
    runs: list[tuple[int, int]],
    conn: Any,
    first: int,
    before: int = 0,
) -> int:
    """While `worker` runs: once it has claimed, enqueue five jobs (only a wake-up can bring
    them to it before its next poll), wait for them to run under its id and for a heartbeat
    of its row; returns its id (`before`: the id of its previous run)."""
    wait_until(
        lambda: worker.id not in (0, before) and worker.stats.claims >= 1, what="a first claim"
    )
    worker_id = worker.id
    queue.enqueue_many([seen.job(first + n) for n in range(5)])
    wait_until(lambda: len(runs) >= first + 5, what="the batch to run")
    assert sorted(runs[first:]) == [(first + n, worker_id) for n in range(5)]

    def beaten() -> bool:
        conn.commit()
        row = conn.execute(
            sql.SQL("SELECT heartbeat_at > started_at FROM {}.workers WHERE id = %s").format(
                sql.Identifier(queue.settings.schema_name)
            ),
            [worker_id],
        ).fetchone()
        return row is not None and bool(row[0])

    wait_until(beaten, what="a heartbeat of the worker's row")
    return worker_id


def test_a_stopped_worker_starts_again_as_a_new_worker_and_runs_jobs(
    queue: Queue, dsn: str, schema: str, conn: Any
) -> None:
    """run_async() again after a run ended: a new registration (a new id, the old row gone),
    claims on wake-ups, heartbeats, jobs run; a third run too. An observer added after the
    Worker was made (as --metrics-port adds one) hears every run's jobs."""
    worker, seen, runs = _restartable(queue, dsn, schema)
    heard = _Heard()
    worker.observers.all.append(heard)
    ids: list[int] = []
    for run in range(3):
        with worker_in_thread(worker):
            before = ids[-1] if ids else 0
            ids.append(_serve_one_batch(queue, worker, seen, runs, conn, 5 * run, before))
        conn.commit()
        assert count(conn, schema, "workers") == 0  # each run deregisters at its end
    assert len(set(ids)) == 3
    assert count(conn, schema, "job_history", "status = 'succeeded'") == 15
    assert len(heard.finished) == 15
    assert sum(worker.tally.outcomes.values()) == 5  # the last run's own count


class _Heard:
    """An observer that keeps the ids of the jobs it heard finish."""

    def __init__(self) -> None:
        self.finished: list[int] = []

    def job_started(self, job: Any) -> None:
        pass

    def job_finished(self, job: Any, outcome: Any) -> None:
        self.finished.append(job.id)

    def claimed(self, seconds: float, jobs: int) -> None:
        pass


def test_a_worker_that_failed_to_start_starts_again(
    dsn: str, schema: str, conn: Any, queue: Queue
) -> None:
    """A start that fails (here: the schema is not migrated yet) leaves a worker that starts
    normally once the cause is gone."""
    bare = f"{schema}_late"
    worker, seen, runs = _restartable(queue, dsn, bare)
    late = Queue(dsn, schema=bare)
    try:
        with pytest.raises(DatabaseError, match="pgqueue migrate"):
            asyncio.run(worker.run_async())
        late.migrate()
        with worker_in_thread(worker):
            _serve_one_batch(late, worker, seen, runs, conn, first=0)
    finally:
        late.close()
        conn.rollback()  # its reads of the schema hold a lock the DROP would wait for
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(bare)))


def test_starting_a_running_worker_is_refused_and_it_runs_on(
    queue: Queue, dsn: str, schema: str, conn: Any
) -> None:
    worker, seen, runs = _restartable(queue, dsn, schema)
    with worker_in_thread(worker):
        wait_until(lambda: worker.id > 0, what="the worker to register")
        with pytest.raises(WorkerStateError, match=r"already running.*another Worker"):
            asyncio.run(worker.run_async())
        with pytest.raises(WorkerStateError):
            worker.run()
        _serve_one_batch(queue, worker, seen, runs, conn, first=0)
    conn.commit()
    assert count(conn, schema, "workers") == 0


def test_a_run_that_could_not_start_leaves_the_worker_startable(
    queue: Queue, dsn: str, schema: str, conn: Any
) -> None:
    """run() sets signal handlers, which only the main thread can: in another thread it
    fails at once, and the worker can still be started."""
    worker, seen, runs = _restartable(queue, dsn, schema)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except Exception as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert len(failures) == 1 and "main thread" in str(failures[0])
    with worker_in_thread(worker):
        _serve_one_batch(queue, worker, seen, runs, conn, first=0)


def test_a_stop_before_the_start_ends_that_run_at_once_and_the_next_runs(
    queue: Queue, dsn: str, schema: str, conn: Any
) -> None:
    worker, seen, runs = _restartable(queue, dsn, schema)
    worker.stop()
    asyncio.run(worker.run_async())  # returns: it was asked to stop
    with worker_in_thread(worker):
        _serve_one_batch(queue, worker, seen, runs, conn, first=0)


_RUN_TWICE = """
import sys
from pgqueue import Queue, Worker
from tests.apps import tasks as apps

dsn, schema = sys.argv[1], sys.argv[2]
queue = Queue(dsn, schema=schema)
worker = Worker(apps.queue, dsn=dsn, schema=schema, burst=True)
for run in range(2):
    queue.enqueue_many([apps.noop.job() for _ in range(4)])
    worker.run()
    print(worker.id, worker.stats.claimed)
queue.close()
"""


def test_run_in_a_process_runs_again_after_it_ended(dsn: str, schema: str, conn: Any) -> None:
    """The blocking run(): a burst run ends once its queues are empty; run() again claims
    the jobs enqueued since, as a new worker."""
    done = run_python("-c", _RUN_TWICE, dsn, schema)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [tuple(map(int, line.split())) for line in done.stdout.splitlines()]
    assert len(runs) == 2 and runs[0][0] != runs[1][0]
    assert [claimed for _, claimed in runs] == [4, 4]
    by_worker = conn.execute(
        sql.SQL(
            "SELECT worker_id, count(*) FROM {}.job_history WHERE status = 'succeeded'"
            " GROUP BY worker_id ORDER BY worker_id"
        ).format(sql.Identifier(schema))
    ).fetchall()
    assert by_worker == [(runs[0][0], 4), (runs[1][0], 4)]
