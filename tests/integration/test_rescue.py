"""Leases and the rescuer: dead workers' jobs come back, live workers keep theirs.

Crash claims are tested by killing real worker processes (SIGKILL) or freezing them
(SIGSTOP); the policy tests strand jobs under a worker id that has no row, as a worker whose
row was already cleaned away would leave them.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobContext, Queue, Worker
from pgqueue.queries import dead_channel
from pgqueue.testing import drain
from pgqueue.worker.rescuer import ORPHAN_PASSES, Rescuer
from tests.apps import tasks as apps
from tests.conftest import count, settings_worker_process, wait_until, worker_in_thread

# Run on each server CI tests against: rescue reads the server's sessions.
pytestmark = pytest.mark.each_server

FAST: dict[str, Any] = {"heartbeat_interval": 0.2, "lease_timeout": 1.0, "rescue_interval": 0.2}


def _history(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    rows = conn.execute(
        sql.SQL(
            "SELECT id, status, attempt, errors, result FROM {}.job_history ORDER BY id"
        ).format(sql.Identifier(schema))
    ).fetchall()
    conn.commit()
    return rows


def _lines(runs: Path, text: str) -> int:
    return sum(1 for _, rest in apps.read_runs(runs) if rest == text)


def test_jobs_of_a_killed_worker_are_rescued_after_the_lease_and_run_again(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    Queue(dsn, schema=schema).enqueue_many([apps.stall_once.job() for _ in range(3)])
    victim = settings_worker_process(
        dsn, schema, FAST | {"concurrency": 3}, log=tmp_path / "victim.log", env=env
    )
    wait_until(lambda: _lines(runs, "attempt 1") == 3, what="3 jobs started")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs", "status = 'running'") == 3
        (last_beat,) = conn.execute(
            sql.SQL("SELECT max(heartbeat_at) FROM {}.workers").format(sql.Identifier(schema))
        ).fetchone()  # type: ignore[misc]
        conn.commit()
        # Started after the death, the rescuer cannot tell it from a server restart (the
        # victim's last beat predates its own session), so it waits for the lease: see
        # test_session_rescue.py for a death another worker sees.
        with worker_in_thread(Worker(apps.queue, dsn=dsn, schema=schema, **FAST), force=True):
            wait_until(lambda: len(_history(conn, schema)) == 3, what="3 rescued jobs")
        history = _history(conn, schema)
        assert count(conn, schema, "workers") == 0  # the dead worker's row is gone too
    assert [(status, attempt, result) for _, status, attempt, _, result in history] == [
        ("succeeded", 2, 2)
    ] * 3
    for *_, errors, _ in [row for row in history]:
        (lost,) = errors
        assert lost["kind"] == "lost" and "presumed lost" in lost["error"]
        # Not sooner than the lease: rescued at least lease_timeout after the last heartbeat.
        rescued_at = datetime.fromisoformat(lost["at"])
        assert (rescued_at - last_beat).total_seconds() >= FAST["lease_timeout"]


def test_a_slow_but_alive_worker_keeps_its_jobs_past_the_lease(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    # Each job blocks its worker's event loop for 3 lease periods; only the heartbeat thread
    # speaks for the worker meanwhile.
    Queue(dsn, schema=schema).enqueue_many([apps.hog.job(3.0) for _ in range(2)])
    slow = settings_worker_process(
        dsn,
        schema,
        FAST | {"concurrency": 1},
        log=tmp_path / "slow.log",
        env={"PGQUEUE_TEST_RUNS": str(runs)},
    )
    try:
        with psycopg.connect(dsn) as conn:
            rescuer = Worker(apps.queue, dsn=dsn, schema=schema, queues=("elsewhere",), **FAST)
            with worker_in_thread(rescuer, force=True):
                wait_until(lambda: len(_history(conn, schema)) == 2, what="both slow jobs")
                assert rescuer.load().rescued == 0
            history = _history(conn, schema)
        assert [(status, attempt, errors) for _, status, attempt, errors, _ in history] == [
            ("succeeded", 1, [])
        ] * 2
        assert _lines(runs, "start") == 2
    finally:
        slow.send_signal(signal.SIGTERM)
        assert slow.wait(timeout=30) == 0


def test_a_frozen_worker_that_wakes_after_its_jobs_were_rescued_cannot_overwrite_them(
    dsn: str, schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("PGQUEUE_TEST_RUNS", str(runs))  # the in-process rescuer records too
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    (job_id,) = Queue(dsn, schema=schema).enqueue_many([apps.sleepy.job(0.5)])
    log = tmp_path / "frozen.log"
    frozen = settings_worker_process(dsn, schema, FAST | {"concurrency": 1}, log=log, env=env)
    try:
        wait_until(lambda: _lines(runs, "start") == 1, what="the job to start")
        frozen.send_signal(signal.SIGSTOP)
        with psycopg.connect(dsn) as conn:
            with worker_in_thread(Worker(apps.queue, dsn=dsn, schema=schema, **FAST), force=True):
                wait_until(lambda: len(_history(conn, schema)) == 1, what="rescue and rerun")
            frozen.send_signal(signal.SIGCONT)
            wait_until(lambda: "were not written" in log.read_text(), what="the late write")
            ((hid, status, attempt, errors, _),) = _history(conn, schema)
        assert (hid, status, attempt) == (job_id, "succeeded", 2)
        assert [e["kind"] for e in errors] == ["lost"]
        # Lease mode: the frozen run finished too (at-least-once); history counts the rerun.
        assert _lines(runs, "start") == 2 and _lines(runs, "done") == 2
        wait_until(lambda: "was presumed dead" in log.read_text(), what="the revived heartbeat")
    finally:
        frozen.send_signal(signal.SIGCONT)
        frozen.send_signal(signal.SIGTERM)
        assert frozen.wait(timeout=30) == 0, log.read_text()


def _strand(conn: psycopg.Connection[Any], schema: str, ids: Sequence[int]) -> int:
    """Mark jobs as running under a worker whose row is then removed: a vanished worker.
    Returns its id."""
    s = sql.Identifier(schema)
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
            " VALUES ('vanished', 'host', 1, '{{default}}', 1) RETURNING id"
        ).format(s)
    ).fetchone()
    assert row is not None
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s, "
            "started_at = now() WHERE id = ANY(%s)"
        ).format(s),
        [row[0], ids],
    )
    conn.execute(sql.SQL("DELETE FROM {}.workers WHERE id = %s").format(s), [row[0]])
    conn.commit()
    return int(row[0])


def test_lost_job_policies_fail_abandon_and_compensate(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    undone: list[dict[str, Any]] = []

    @queue.task(name="lost_retry", max_attempts=1)
    def lost_retry() -> None: ...

    @queue.task(name="lost_fail", on_lost="fail")
    def lost_fail() -> None: ...

    @queue.task(name="lost_abandon", on_lost="abandon")
    def lost_abandon() -> None: ...

    @queue.task(name="lost_comp", on_lost="compensate", compensate_with="undo")
    def lost_comp(order: int) -> None: ...

    @queue.task(name="undo")
    def undo(job_id: int, task: str, args: dict[str, Any], ctx: JobContext) -> None:
        undone.append({"job_id": job_id, "task": task, "args": args})

    ids = queue.enqueue_many(
        [lost_retry.job(), lost_fail.job(), lost_abandon.job(), lost_comp.job(7)]
    )
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(dead_channel(schema))))
        _strand(conn, schema, ids)
        rescuer = Rescuer(
            queue.registry, schema, lease=__import__("datetime").timedelta(0), keep_history=True
        )

        async def rescue() -> int:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
                return await rescuer.rescue(aconn)

        assert asyncio.run(rescue()) == 4
        notes = [json.loads(n.payload) for n in listener.notifies(timeout=1, stop_after=1)]
        drain(queue)
        history = {row[0]: row for row in _history(conn, schema)}
    kinds = {job_id: (history[job_id][1], history[job_id][3][-1]["kind"]) for job_id in ids}
    assert kinds == {
        ids[0]: ("failed", "lost"),  # retry policy, but attempts were used up
        ids[1]: ("failed", "lost"),
        ids[2]: ("failed", "abandoned"),
        ids[3]: ("failed", "compensated"),
    }
    assert notes == [{"id": ids[2], "task": "lost_abandon", "queue": "default"}]
    assert undone == [{"job_id": ids[3], "task": "lost_comp", "args": {"order": 7}}]


def test_jobs_whose_worker_row_is_gone_are_rescued_within_orphan_passes(
    dsn: str, schema: str
) -> None:
    """The look for orphans walks every running entry, so it runs on the first pass and then
    every ORPHAN_PASSES passes; a job stranded under a vanished worker in between waits for
    the next one, and no longer."""
    queue = Queue(dsn, schema=schema)

    @queue.task(name="orphan", max_attempts=1)
    def orphan() -> None: ...

    rescuer = Rescuer(queue.registry, schema, lease=timedelta(0), keep_history=True)

    async def passes(n: int) -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            return [await rescuer.rescue(aconn) for _ in range(n)]

    assert asyncio.run(passes(1)) == [0]  # the first pass: nothing stranded yet
    (job_id,) = queue.enqueue_many([orphan.job()])
    with psycopg.connect(dsn) as conn:
        _strand(conn, schema, [job_id])
    assert asyncio.run(passes(ORPHAN_PASSES)) == [0] * (ORPHAN_PASSES - 1) + [1]
    with psycopg.connect(dsn) as conn:
        assert [(row[0], row[1]) for row in _history(conn, schema)] == [(job_id, "failed")]


def test_a_worker_frozen_in_the_middle_of_a_beat_does_not_hold_up_the_rescue(
    dsn: str, schema: str
) -> None:
    """A worker stopped (SIGSTOP, a paused VM) inside the transaction of a beat keeps its
    row locked. The rescuing transaction rescues its lapsed jobs and then removes silent
    workers: it leaves a locked row for a later pass instead of waiting for it, which held
    the rescue lock, and with it every worker's rescues, until the frozen one woke."""
    queue = Queue(dsn, schema=schema)

    @queue.task(name="held_up", max_attempts=2)
    def held_up() -> None: ...

    (job_id,) = queue.enqueue_many([held_up.job()])
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as frozen:
        (worker_id,) = conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency, heartbeat_at)"
                " VALUES ('frozen', 'host', 1, '{{default}}', 1, now() - interval '1 hour')"
                " RETURNING id"
            ).format(s)
        ).fetchone() or (None,)
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s,"
                " started_at = now() WHERE id = %s"
            ).format(s),
            [worker_id, job_id],
        )
        # The frozen beat: its row locked by a transaction that never ends meanwhile.
        frozen.execute(
            sql.SQL("SELECT 1 FROM {}.workers WHERE id = %s FOR UPDATE").format(s), [worker_id]
        )
        rescuer = Rescuer(queue.registry, schema, lease=timedelta(seconds=1), keep_history=True)

        async def rescue() -> int:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
                return await asyncio.wait_for(rescuer.rescue(aconn), 10)

        assert asyncio.run(rescue()) == 1
        job = queue.get_job(job_id)
        assert job is not None and job.status in ("queued", "scheduled") and job.attempt == 1
        workers = sql.SQL("SELECT count(*) FROM {}.workers WHERE id = %s").format(s)
        assert conn.execute(workers, [worker_id]).fetchone() == (1,)  # left for a later pass
        frozen.rollback()  # the worker woke: the next pass removes its row
        assert asyncio.run(rescue()) == 0
        assert conn.execute(workers, [worker_id]).fetchone() == (0,)
    queue.close()
