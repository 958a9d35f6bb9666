"""A batch of outcomes locks its jobs' concurrency slots, in key order, before any job moves
(job_finish_many, migration 0007): unless every job of the batch came from the claim that
takes only jobs without keys (job_claim_unkeyed), which has no slot to lock, and where
reading the batch's rows again to find no key was a visible part of the finish.

A batch also takes its jobs' rows before their slots (migration 0038), so a claim holding
one of those rows never waits for a slot the batch holds; the orphan release locks the same
way.

The first test is counted by PostgreSQL itself: a real worker process drains the queue with
function statistics on for its sessions, and pg_stat_user_functions says whether the lock
function ran. Keyed jobs are the control: their batches still lock.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import succeeded
from pgqueue import Queue
from pgqueue.queries import query
from tests.apps import tasks as apps
from tests.conftest import claim_params, count, function_calls, wait_until, worker_process

# Run on each server CI tests against: row and slot locks as the server takes them.
pytestmark = pytest.mark.each_server

JOBS = 60


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "control-keyed"])
def test_a_batch_of_jobs_without_keys_looks_for_no_slot_to_lock(
    dsn: str, schema: str, tmp_path: Path, keyed: bool
) -> None:
    queue = Queue(dsn, schema=schema)
    task = apps.noop.with_options(concurrency_key="tenant:1") if keyed else apps.noop
    queue.enqueue_many([task.job() for _ in range(JOBS)])
    # The worker's own sessions count their function calls (a superuser's setting).
    counted = psycopg.conninfo.make_conninfo(dsn, options="-c track_functions=pl")
    log = tmp_path / "worker.log"
    proc = worker_process(counted, schema, "--burst", "--concurrency", "10", log=log)
    try:
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with psycopg.connect(dsn, autocommit=True) as conn:
        finished = count(conn, schema, "job_history", "status = 'succeeded'")
        assert finished == JOBS
        assert count(conn, schema, "jobs") == 0
        # A backend hands its counts over as it ends; the worker's have ended or are ending.
        # Every finish tells waiters (notify_waiters), keyed or not: once those calls are
        # counted, so are the lock's.
        wait_until(
            lambda: function_calls(conn, schema, "notify_waiters") > 0,
            timeout=10,
            what="the finishes",
        )
        locks = function_calls(conn, schema, "concurrency_lock_slots")
    if keyed:
        assert locks > 0
    else:
        assert locks == 0


def test_a_finish_waiting_on_a_job_a_claim_holds_takes_no_slot_first(dsn: str, schema: str) -> None:
    """A claim can hold the row of a job that is already running elsewhere: `FOR UPDATE SKIP
    LOCKED` reads its snapshot, finds the job queued there, and locks its latest version,
    which was claimed and committed since; the job then fails the status re-check and is
    skipped, but PostgreSQL keeps that row lock until the claim commits. If the claim then
    waits for a slot row held by the finish of that same job, and the finish waits for the
    job's row, they deadlock. A finish must take its jobs' rows before their slots.

    The claim's stray row lock is taken here by hand, on one side of a real job_finish_many
    (the window it opens by itself in a run of claiming processes is too narrow to hit on
    demand), then the claim's slot lock with a lock_timeout longer than deadlock_timeout."""
    queue = Queue(dsn, schema=schema)
    try:
        queue.enqueue(apps.noop.with_options(concurrency_key="tenant:1").job())
    finally:
        queue.close()
    with psycopg.connect(dsn, autocommit=True) as worker:
        rows = worker.execute(query("job_claim", schema), claim_params(worker_id=7)).fetchall()
        assert [r[8] for r in rows] == [False]  # claimed, not parked
        job_id = rows[0][0]
    finished: list[Any] = []

    with psycopg.connect(dsn) as claim, psycopg.connect(dsn, autocommit=True) as finisher:
        claim.execute(
            sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            [job_id],
        )
        finisher_pid = finisher.info.backend_pid

        def finish() -> None:
            try:
                params = succeeded([job_id], worker_id=7)
                finished.append(
                    finisher.execute(query("job_finish_many", schema), params).fetchone()
                )
            except psycopg.Error as exc:
                finished.append(exc)

        thread = threading.Thread(target=finish)
        thread.start()
        with psycopg.connect(dsn, autocommit=True) as watch:
            wait_until(
                lambda: (
                    watch.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                        [finisher_pid],
                    ).fetchone()
                    == ("Lock",)
                ),
                timeout=10,
                what="the finish waiting on the job's row",
            )
        claim.execute("SET LOCAL lock_timeout = '5s'")
        slots = claim.execute(
            sql.SQL(
                "SELECT key, running FROM {}.concurrency_slots WHERE key = 'tenant:1' FOR UPDATE"
            ).format(sql.Identifier(schema))
        ).fetchall()
        assert slots == [("tenant:1", 1)]
        claim.commit()
        thread.join(timeout=30)
    assert len(finished) == 1 and not isinstance(finished[0], Exception), finished
    assert finished[0][0] == 1  # the job left the hot table
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert count(conn, schema, "job_history", "status = 'succeeded'") == 1
        assert count(conn, schema, "concurrency_slots", "running <> 0") == 0


def test_orphans_put_back_give_their_slots_back(dsn: str, schema: str) -> None:
    """The orphan release (a claim's reply lost with its connection), which now locks its
    jobs' rows and slots first as a batch of outcomes does, still puts back every job of the
    worker it was not told about, and each gives its slot back."""
    queue = Queue(dsn, schema=schema)
    try:
        queue.enqueue_many(
            [apps.noop.with_options(concurrency_key=f"tenant:{n % 2}").job() for n in range(4)]
        )
    finally:
        queue.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(query("job_claim", schema), claim_params(worker_id=7)).fetchall()
        ids = sorted(r[0] for r in rows if not r[8])
        assert len(ids) == 4
        known = ids[:1]
        put_back = conn.execute(
            query("job_release_orphans", schema), {"worker_id": 7, "known": known}
        ).fetchall()
        assert sorted(r[0] for r in put_back) == ids[1:]
        slots = conn.execute(
            sql.SQL("SELECT key, running FROM {}.concurrency_slots ORDER BY key").format(
                sql.Identifier(schema)
            )
        ).fetchall()
        assert slots == [("tenant:0", 1), ("tenant:1", 0)]
        assert count(conn, schema, "jobs", "status = 'queued'") == 3
