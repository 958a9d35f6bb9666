"""Behind a real PgBouncer in transaction pooling mode: applications enqueue through it (the
queue's own pool and their own connections, sync and async), and `--poll-only` workers claim
and finish through it, each job once, listening for wake-ups on a direct connection if told
to. Server connections are shared between clients from
one transaction to the next there, so nothing may rely on session state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.sql
import pytest

from pgqueue import AsyncQueue, JobContext, Queue
from pgqueue.store.workers import BeatParams, WorkerIdentity, WorkersStore
from pgqueue.testing import drain
from tests.apps import tasks as apps
from tests.apps.pgbouncer import pgbouncer
from tests.conftest import (
    clean_exit_logs,
    count,
    stop_worker_processes,
    wait_until,
    worker_process,
)

# Run on each server CI tests against: PgBouncer in front of each server.
pytestmark = pytest.mark.each_server

POOL_SIZE = 20  # server connections PgBouncer keeps per database and user


@pytest.fixture
def bouncer(dsn: str) -> Iterator[str]:
    with pgbouncer(dsn, pool_size=POOL_SIZE) as through:
        yield through


def test_applications_enqueue_and_read_through_pgbouncer(
    dsn: str, schema: str, bouncer: str
) -> None:
    queue = Queue(bouncer, schema=schema, prepare=False)
    # Past psycopg's prepare threshold: a statement prepared on one server connection must
    # not be looked for on another.
    ids = [queue.enqueue(apps.noop.job()) for _ in range(30)]
    ids += queue.enqueue_many([apps.noop.job() for _ in range(3)])
    for _ in range(10):
        assert queue.get_job(ids[0]) is not None
        assert len(queue.list_jobs(limit=5).jobs) == 5
    with psycopg.connect(bouncer, prepare_threshold=None) as conn:
        for _ in range(10):
            queue.enqueue(apps.noop.job(), conn=conn)
            conn.commit()
        queue.enqueue(apps.noop.job(), conn=conn)
        conn.rollback()
    queue.close()

    async def from_async() -> None:
        aqueue = AsyncQueue(bouncer, schema=schema, prepare=False)
        for _ in range(10):
            await aqueue.enqueue(apps.noop.job())
        await aqueue.close()

    asyncio.run(from_async())
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 30 + 3 + 10 + 10


def test_a_beat_through_pgbouncer_records_no_session_even_unasked(
    dsn: str, schema: str, bouncer: str
) -> None:
    """A worker not told that it goes through a pooler still finds out: PgBouncer gives each
    client a backend pid of its own making, never its server session's, so the heartbeat's
    beat records no session and the worker is left to its lease."""
    store = WorkersStore(schema)
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)
    with psycopg.connect(bouncer, autocommit=True, prepare_threshold=None) as pooled:
        beat = store.heartbeat(pooled, BeatParams(identity, 1, client_pid=pooled.info.backend_pid))
    assert not beat.recorded
    with psycopg.connect(dsn, autocommit=True) as direct:
        assert count(direct, schema, "workers", "session_pid IS NOT NULL") == 0
        beat = store.heartbeat(direct, BeatParams(identity, 1, client_pid=direct.info.backend_pid))
        assert beat.recorded  # the same beat on a session of its own


def test_poll_only_workers_run_every_job_once_through_pgbouncer(
    dsn: str, schema: str, bouncer: str, tmp_path: Path
) -> None:
    jobs = 300
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    args = ("--poll-only", "--poll-interval", "0.2", "--concurrency", "8")
    procs = [worker_process(bouncer, schema, *args, log=log) for log in logs]
    queue = Queue(bouncer, schema=schema, prepare=False)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(
                lambda: count(conn, schema, "workers", "heartbeat_at > started_at") == 2,
                what="2 workers, each past its first beat",
            )
            # No session recorded: the server connection outlives the worker and serves
            # other clients, so only the lease speaks for these workers.
            assert count(conn, schema, "workers", "session_pid IS NOT NULL") == 0
            assert count(conn, schema, "workers", "session_at IS NOT NULL") == 0
        # Half the jobs hold two limit keys (every key at most 2 at once) and a fairness key:
        # their admission, release and stamping hold no session state either.
        queue.set_concurrency_limit(None, 2)
        keyed = [
            apps.noop.with_options(limits=[f"t{i % 3}", f"u{i % 5}"], fairness_key=f"t{i % 3}")
            for i in range(jobs // 2)
        ]
        queue.enqueue_many([task.job() for task in keyed])
        queue.enqueue_many([apps.noop.job() for _ in range(jobs - jobs // 2)])
        with psycopg.connect(dsn) as conn:

            def finished() -> int:
                conn.commit()
                return count(conn, schema, "job_history")

            wait_until(lambda: finished() == jobs, what="every job through PgBouncer")
            runs = conn.execute(
                f'SELECT count(DISTINCT id), max(attempt), min(status) FROM "{schema}".job_history'
            ).fetchone()
    finally:
        stop_worker_processes(procs)
        queue.close()
    clean_exit_logs(procs, logs)
    assert runs == (jobs, 1, "succeeded")
    # The workers left no session setting on the server connections other clients get next:
    # as many open transactions as the pool has server connections hold every one of them.
    clients = [psycopg.connect(bouncer, prepare_threshold=None) for _ in range(POOL_SIZE)]
    try:
        seen = {
            c.execute(
                "SELECT current_setting('synchronous_commit'), current_setting('enable_seqscan')"
            ).fetchone()
            for c in clients
        }
    finally:
        for c in clients:
            c.close()
    assert seen == {("on", "on")}


def test_a_poll_only_worker_listening_directly_starts_jobs_at_once_through_pgbouncer(
    dsn: str, schema: str, bouncer: str, tmp_path: Path
) -> None:
    """Claims through PgBouncer, LISTEN on a direct connection: a job starts on its wake-up,
    long before the worker's next poll."""
    log = tmp_path / "worker.log"
    args = ("--poll-only", "--listen-dsn", dsn, "--poll-interval", "60", "--concurrency", "4")
    proc = worker_process(bouncer, schema, *args, log=log)
    queue = Queue(bouncer, schema=schema, prepare=False)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:

            def listening() -> bool:
                found = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = 'pgqueue:listen' AND query LIKE 'LISTEN %%'"
                ).fetchone()
                return found is not None and found[0] == 1

            wait_until(listening, what="the worker listening on its direct connection")
            # Its rows in wake_listeners, written through PgBouncer, ask for every wake-up.
            wait_until(lambda: count(conn, schema, "wake_listeners") == 1, what="its row")
            ids = []
            for _ in range(5):
                ids.append(queue.enqueue(apps.noop.job()).id)
                time.sleep(0.3)

            def finished() -> int:
                return count(conn, schema, "job_history")

            wait_until(lambda: finished() == 5, timeout=20, what="5 jobs, each on its wake-up")
            waits = conn.execute(
                f"SELECT max(extract(epoch FROM started_at - created_at)), max(attempt)"
                f' FROM "{schema}".job_history WHERE id = ANY(%s)',
                [ids],
            ).fetchone()
    finally:
        stop_worker_processes([proc])
        queue.close()
    clean_exit_logs([proc], [log])
    assert waits is not None
    assert waits[0] < 5.0, f"a job waited {waits[0]:.1f} s: it started on a poll, not a wake-up"
    assert waits[1] == 1
    assert "poll only, listening apart" in log.read_text()


def test_durable_steps_of_lease_and_atomic_jobs_commit_once_through_pgbouncer(
    dsn: str, schema: str, bouncer: str
) -> None:
    """A step's record, and an atomic job's segment (its commit, the next BEGIN and relock
    sent together in one round trip), through transaction pooling: each step recorded once,
    each atomic write committed once, every job succeeded."""
    queue = Queue(bouncer, schema=schema, prepare=False)
    table = psycopg.sql.Identifier(schema, "writes")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE TABLE {} (job bigint, step int)").format(table))
    insert = psycopg.sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table)

    def same(i: int) -> int:
        return i

    @queue.task(name="three_lease_steps")
    def three_lease_steps(ctx: JobContext) -> int:
        return sum(ctx.step(f"s{i}", same, i) for i in range(3))

    @queue.task(name="three_atomic_steps", atomic=True)
    def three_atomic_steps(ctx: JobContext) -> int:
        def write(i: int) -> int:
            ctx.connection.execute(insert, [ctx.job_id, i])
            return i

        return sum(ctx.step(f"s{i}", write, i) for i in range(3))

    jobs = 20
    lease = queue.enqueue_many([three_lease_steps.job() for _ in range(jobs)])
    atomic = queue.enqueue_many([three_atomic_steps.job() for _ in range(jobs)])
    drain(queue, dsn=bouncer, poll_only=True, concurrency=4, atomic_concurrency=2)
    for job_id in lease + atomic:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "succeeded" and job.result == 3, job
    queue.close()
    with psycopg.connect(dsn) as conn:
        steps = conn.execute(
            psycopg.sql.SQL("SELECT count(*), count(DISTINCT (job_id, seq)) FROM {}").format(
                psycopg.sql.Identifier(schema, "job_steps")
            )
        ).fetchone()
        writes = conn.execute(
            psycopg.sql.SQL("SELECT count(*), count(DISTINCT (job, step)) FROM {}").format(table)
        ).fetchone()
    assert steps == (6 * jobs, 6 * jobs)
    assert writes == (3 * jobs, 3 * jobs)
