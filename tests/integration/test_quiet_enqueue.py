"""Enqueues notify only the workers that wait for a wake-up (sql/migrations/0015_quiet_wake.sql,
pgqueue/worker/interest.py).

Every transaction that notifies takes PostgreSQL's database-wide notification lock while it
commits, so those commits run one at a time. While the workers are busy, nobody needs the
notice: here 16 connections enqueue into a queue whose worker processes have every slot
busy, and no notification is sent and no commit ever holds or waits for that lock. The race
that quiet enqueues open, a job committed just as a worker goes back to waiting, is run many
times against a worker that cannot poll its way out of it.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker
from pgqueue.queries import channel
from tests.apps import tasks as apps
from tests.conftest import (
    clean_exit_logs,
    listen_for_wakes,
    settings_worker_process,
    stop_worker_processes,
    wait_until,
    worker_in_thread,
)

ENQUEUERS = 16
# PreCommit_Notify's lock: an exclusive lock on the object 0 of pg_database, database 0.
NOTIFY_LOCK = """
SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted)
FROM pg_locks AS l
WHERE l.locktype = 'object' AND l.classid = 'pg_database'::regclass AND l.objid = 0
"""
NOTIFY_WAITS = """
SELECT count(*) FROM pg_stat_activity
WHERE application_name = 'quiet enqueuer' AND wait_event_type = 'Lock' AND wait_event = 'object'
"""


def _quiet(conn: psycopg.Connection[Any], schema: str, workers: int) -> bool:
    """Whether `workers` workers skip the wake-ups of priority-0 jobs (every slot busy)."""
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}.wake_listeners WHERE below <= 0 AND 0 <= above").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    return row is not None and row[0] == workers


@pytest.mark.parametrize("waiting", [False, True], ids=["workers-busy", "control-one-waits"])
def test_enqueues_while_workers_are_busy_never_take_the_notification_lock(
    dsn: str, schema: str, tmp_path: Path, waiting: bool
) -> None:
    # The control adds a listener that waits for work, so every enqueue notifies as all did
    # before quiet wake-ups: the same sampling then sees the lock.
    queue = Queue(dsn, schema=schema)
    # Two worker processes, every slot busy for far longer than the test.
    queue.enqueue_many([apps.asleepy.job(60.0) for _ in range(20)])
    settings = {"concurrency": 2, "quiet_after": 0.1, "shutdown_grace": 0}
    logs = [tmp_path / f"worker-{n}.log" for n in range(2)]
    procs = [settings_worker_process(dsn, schema, settings, log=log) for log in logs]
    stop = threading.Event()
    try:
        with (
            psycopg.connect(dsn, autocommit=True) as watch,
            psycopg.connect(dsn, autocommit=True) as listener,
        ):
            # Both workers busy and asking only for jobs more urgent than their hint's.
            wait_until(lambda: _quiet(watch, schema, 2), what="both workers to go quiet")
            if waiting:
                listen_for_wakes(listener, schema)
            else:
                listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
            enqueued = [0] * ENQUEUERS
            samples = {"held": 0, "waiting": 0, "waits": 0, "taken": 0}

            def enqueue(n: int) -> None:
                with psycopg.connect(
                    dsn, autocommit=True, application_name="quiet enqueuer"
                ) as conn:
                    while not stop.is_set():
                        queue.enqueue(apps.noop.job(), conn=conn)
                        enqueued[n] += 1

            threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(ENQUEUERS)]
            for thread in threads:
                thread.start()
            try:
                wait_until(lambda: sum(enqueued) >= 2000, what="2,000 enqueues")
                while sum(enqueued) < 4000:
                    held, waiters = watch.execute(NOTIFY_LOCK).fetchone() or (0, 0)
                    (waits,) = watch.execute(NOTIFY_WAITS).fetchone() or (0,)
                    samples["held"] += held
                    samples["waiting"] += waiters
                    samples["waits"] += waits
                    samples["taken"] += 1
            finally:
                stop.set()
                for thread in threads:
                    thread.join(30)
            notes = [n.payload for n in listener.notifies(timeout=0.5)]
            assert _quiet(watch, schema, 2)  # still quiet throughout
    finally:
        stop_worker_processes(procs)
    assert samples["taken"] > 50, samples
    wakes = [n for n in notes if not n.startswith("!")]
    if waiting:
        assert samples["held"] + samples["waiting"] + samples["waits"] > 0, samples
        assert len(wakes) == sum(enqueued)
    else:
        assert (samples["held"], samples["waiting"], samples["waits"]) == (0, 0, 0), samples
        assert wakes == []
    clean_exit_logs(procs, logs)


def test_a_job_committed_as_the_worker_goes_back_to_waiting_runs_without_a_poll(
    queue: Queue, dsn: str, schema: str
) -> None:
    # The worker polls once a minute and never forgets its hint, so only the protocol can
    # find each probe job in time: a probe enqueued while the worker is quiet (no notice)
    # and committed at a random moment around its going back to waiting.
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    @queue.task(name="hold")
    def hold() -> None:
        started.set()
        release.wait(30)

    @queue.task(name="probe")
    def probe(n: int) -> None:
        ran.append(n)

    rng = random.Random(20)
    worker = Worker(
        queue,
        dsn=dsn,
        concurrency=1,
        quiet_after=0,
        poll_interval=60,
        hint_reset_interval=3600,
        hint_reset_jitter=0,
    )
    rounds = 60
    with worker_in_thread(worker, force=True), psycopg.connect(dsn, autocommit=True) as watch:
        for n in range(rounds):
            started.clear()
            release.clear()
            queue.enqueue(hold.job())
            assert started.wait(30)
            wait_until(lambda: _quiet(watch, schema, 1), what="the worker to go quiet")
            with psycopg.connect(dsn) as conn:
                queue.enqueue(probe.job(n), conn=conn)  # checked now: no notice
                if rng.random() < 0.5:
                    release.set()
                    time.sleep(rng.uniform(0, 0.01))
                    conn.commit()
                else:
                    conn.commit()
                    time.sleep(rng.uniform(0, 0.01))
                    release.set()
            # Far sooner than the next poll, a minute away.
            wait_until(lambda n=n: ran[-1:] == [n], timeout=20, what="the probe")
    assert ran == list(range(rounds))
    interest = worker.current.interest
    assert interest is not None and interest.widenings >= rounds
    # Some probes committed after the claim that followed the widening: the claim made once
    # their transaction ended is what found them.
    assert interest.settlements > 0, interest.settlements


def test_a_worker_presumed_dead_and_revived_asks_for_its_wake_ups_again(
    queue: Queue, dsn: str, schema: str
) -> None:
    # Its wake_listeners rows go with its worker row; the heartbeat puts the row back and
    # the worker writes its rows again, or enqueues would never wake it.
    ran = threading.Event()
    t = queue.task(name="t")(lambda: ran.set())
    worker = Worker(queue, dsn=dsn, poll_interval=60, heartbeat_interval=0.2, lease_timeout=1)
    s = sql.Identifier(schema)
    with worker_in_thread(worker, force=True), psycopg.connect(dsn, autocommit=True) as watch:

        def rows() -> int:
            found = watch.execute(sql.SQL("SELECT count(*) FROM {}.wake_listeners").format(s))
            return int((found.fetchone() or (0,))[0])

        wait_until(lambda: rows() == 1, what="the worker's row")
        watch.execute(sql.SQL("DELETE FROM {}.workers").format(s))  # as the rescuer does
        assert rows() == 0
        wait_until(lambda: rows() == 1, what="the revived worker's row")
        queue.enqueue(t.job())
        # The next poll is a minute away: only a wake-up starts it in time.
        assert ran.wait(20)
