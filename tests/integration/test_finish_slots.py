"""A batch of outcomes locks its jobs' concurrency slots, in key order, before any job moves
(job_finish_many, migration 0007): unless every job of the batch came from the claim that
takes only jobs without keys (job_claim_unkeyed), which has no slot to lock, and where
reading the batch's rows again to find no key was a visible part of the finish.

Counted by PostgreSQL itself: a real worker process drains the queue with function
statistics on for its sessions, and pg_stat_user_functions says whether the lock function
ran. Keyed jobs are the control: their batches still lock.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import count, function_calls, wait_until, worker_process

JOBS = 60


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "control-keyed"])
def test_a_batch_of_jobs_without_keys_looks_for_no_slot_to_lock(
    dsn: str, schema: str, tmp_path: Path, keyed: bool
) -> None:
    queue = Queue(dsn, schema=schema)
    task = apps.noop.with_options(concurrency_key="tenant:1") if keyed else apps.noop
    queue.enqueue_many([task.job() for _ in range(JOBS)])
    # The worker's own sessions count their function calls (a superuser's setting).
    counted = dsn + ("&" if "?" in dsn else "?") + "options=" + quote("-c track_functions=pl")
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
