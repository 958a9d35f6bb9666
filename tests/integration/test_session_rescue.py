"""A worker whose process dies is found dead by its ended session, within seconds, not after its
lease; a live worker whose session the server ends takes its lock back and keeps its jobs.

Real worker processes: one is killed (SIGKILL), or frozen (SIGSTOP) while the test ends its
heartbeat's session, so that another worker's rescuer sees the worker's lock free for as long
as the test holds it so. The lease is a minute, so only the session can explain a rescue in
seconds.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker
from tests.apps import tasks as apps
from tests.conftest import count, settings_worker_process, wait_until, worker_in_thread

# Run on each server CI tests against: rescue reads the server's sessions.
pytestmark = pytest.mark.each_server

# The rescue pass every 10 s, the lease a minute: within seconds only the session path rescues.
SETTINGS: dict[str, Any] = {"heartbeat_interval": 1.0, "lease_timeout": 60.0}
PROMISE = 5.0  # seconds from a worker's death to its jobs' rescue, as the documentation says


def _lines(runs: Path, text: str) -> int:
    return sum(1 for _, rest in apps.read_runs(runs) if rest == text)


def _one(conn: psycopg.Connection[Any], query: str, schema: str, *params: object) -> Any:
    row = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchone()
    assert row is not None
    return row[0]


def _vouched(conn: psycopg.Connection[Any], schema: str, worker: int, rescuer: int) -> bool:
    """Whether `worker` has beaten since `rescuer` registered, so after `rescuer`'s claim
    connection opened: only then can that rescuer tell a death from a server restart
    (worker_sessions_gone in sql/queries/workers.sql)."""
    return bool(
        _one(
            conn,
            "SELECT w.heartbeat_at > r.started_at FROM {s}.workers AS w, {s}.workers AS r"
            " WHERE w.id = %s AND r.id = %s",
            schema,
            worker,
            rescuer,
        )
    )


def _lock_holders(conn: psycopg.Connection[Any], schema: str, worker: int) -> list[int]:
    """The backends holding `worker`'s session lock (worker_session_hold)."""
    rows = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND classid = hashtext('pgqueue.worker ' || %s)::oid"
        " AND objid = (%s::bigint %% 2147483647)::integer::oid AND objsubid = 2",
        [schema, worker],
    ).fetchall()
    return [int(row[0]) for row in rows]


def test_a_killed_workers_jobs_run_again_within_seconds_not_after_its_lease(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    procs = [
        settings_worker_process(
            dsn, schema, SETTINGS | {"concurrency": 2}, log=tmp_path / f"w{n}.log", env=env
        )
        for n in range(2)
    ]
    queue = Queue(dsn, schema=schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(
                lambda: count(conn, schema, "workers", "session_at IS NOT NULL") == 2,
                what="two workers holding their session locks",
            )
            (job_id,) = queue.enqueue_many([apps.stall_once.job()])
            wait_until(lambda: _lines(runs, "attempt 1") == 1, what="the job's first attempt")
            victim_id, victim_pid = conn.execute(
                sql.SQL(
                    "SELECT w.id, w.pid FROM {s}.jobs AS j JOIN {s}.workers AS w"
                    " ON w.id = j.worker_id WHERE j.id = %s"
                ).format(s=sql.Identifier(schema)),
                [job_id],
            ).fetchone()  # type: ignore[misc]
            (victim,) = [p for p in procs if p.pid == victim_pid]
            (survivor,) = [p for p in procs if p.pid != victim_pid]
            survivor_id = _one(
                conn, "SELECT id FROM {s}.workers WHERE pid = %s", schema, survivor.pid
            )
            wait_until(
                lambda: _vouched(conn, schema, victim_id, survivor_id),
                what="a beat of the victim since the survivor started",
            )
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            wait_until(
                lambda: count(conn, schema, "job_history") == 1,
                what="the job rescued and run again",
                timeout=45,  # well inside the lease: the lease cannot have done it
            )
            status, attempt, errors = conn.execute(
                sql.SQL("SELECT status, attempt, errors FROM {s}.job_history").format(
                    s=sql.Identifier(schema)
                )
            ).fetchone()  # type: ignore[misc]
            assert count(conn, schema, "workers") == 1  # the victim's row went with it
        (lost,) = errors
        assert (status, attempt, lost["kind"]) == ("succeeded", 2, "lost")
        assert "session ended" in lost["error"], lost["error"]
        rescued_in = datetime.fromisoformat(lost["at"]).timestamp() - killed_at
        assert rescued_in < PROMISE, f"rescued {rescued_in:.1f} s after the kill"
        rerun = (runs / f"runs-{survivor.pid}.txt").read_text().splitlines()
        assert rerun == [f"{job_id} attempt 2"]
    finally:
        queue.close()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)


def test_a_live_worker_whose_session_is_ended_takes_its_lock_back_and_keeps_its_job(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    log = tmp_path / "live.log"
    queue = Queue(dsn, schema=schema)
    queue.enqueue_many([apps.sleepy.job(6.0)])
    queue.close()
    live = settings_worker_process(
        dsn, schema, SETTINGS | {"concurrency": 1}, log=log, env={"PGQUEUE_TEST_RUNS": str(runs)}
    )
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: _lines(runs, "start") == 1, what="the job to start")
            live_id = _one(conn, "SELECT id FROM {s}.workers WHERE pid = %s", schema, live.pid)
            # Serves another queue: the job stays the live worker's unless rescued.
            other = Worker(apps.queue, dsn=dsn, schema=schema, queues=("elsewhere",), **SETTINGS)
            with worker_in_thread(other, force=True):
                wait_until(lambda: other.id > 0, what="the rescuing worker's registration")
                wait_until(
                    lambda: _vouched(conn, schema, live_id, other.id),
                    what="a beat of the live worker since the other started",
                )
                session_at = _one(
                    conn, "SELECT session_at FROM {s}.workers WHERE id = %s", schema, live_id
                )
                # Frozen, the worker cannot take its lock back until the rescuer has seen it
                # free; then it must, within the grace.
                live.send_signal(signal.SIGSTOP)
                try:
                    (holder,) = _lock_holders(conn, schema, live_id)
                    conn.execute("SELECT pg_terminate_backend(%s)", [holder])
                    wait_until(
                        lambda: live_id in other.rescuer.gone.suspects,
                        what="the rescuer seeing the live worker's lock free",
                    )
                finally:
                    live.send_signal(signal.SIGCONT)
                wait_until(
                    lambda: (
                        _one(
                            conn,
                            "SELECT session_at FROM {s}.workers WHERE id = %s",
                            schema,
                            live_id,
                        )
                        != session_at
                    ),
                    what="the live worker's new session",
                )
                assert len(_lock_holders(conn, schema, live_id)) == 1
                wait_until(lambda: count(conn, schema, "job_history") == 1, what="the job's end")
                assert other.rescuer.rescued == 0
            status, attempt, errors = conn.execute(
                sql.SQL("SELECT status, attempt, errors FROM {s}.job_history").format(
                    s=sql.Identifier(schema)
                )
            ).fetchone()  # type: ignore[misc]
        assert (status, attempt, errors) == ("succeeded", 1, [])
        assert _lines(runs, "start") == 1 and _lines(runs, "done") == 1
        assert "presumed dead" not in log.read_text()
    finally:
        live.send_signal(signal.SIGCONT)
        live.send_signal(signal.SIGTERM)
        assert live.wait(timeout=30) == 0, log.read_text()
