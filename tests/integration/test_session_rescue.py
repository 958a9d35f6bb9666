"""A worker whose process dies is found dead by its ended session within seconds, not after its
lease, by any worker: one already running, one started a moment before the death, or the
dead worker's own replacement. A live worker whose session the server ends records its new
session and keeps its jobs.

Real worker processes, killed with SIGKILL, or frozen (SIGSTOP) while the test ends their
heartbeat's session. The lease is a minute, so only the session can explain a rescue in
seconds. Each rescue test waits for the job's second attempt to start, with the documented
promise as its deadline, and prints how long it took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker
from pgqueue.migrate import apply
from pgqueue.store.workers import BeatParams, WorkerIdentity, WorkersStore
from tests.apps import tasks as apps
from tests.conftest import count, settings_worker_process, wait_until, worker_in_thread

# Run on each server CI tests against: rescue reads the server's sessions.
pytestmark = pytest.mark.each_server

# The rescue pass every 10 s, the lease a minute: within seconds only the session path rescues.
# Beats at the default interval: a rescue by session owes nothing to them.
SETTINGS: dict[str, Any] = {"lease_timeout": 60.0}
PROMISE = 5.0  # seconds from a worker's death to its job running again, as the docs say


def _lines(runs: Path, text: str) -> int:
    return sum(1 for _, rest in apps.read_runs(runs) if rest == text)


def _one(conn: psycopg.Connection[Any], query: str, schema: str, *params: object) -> Any:
    row = conn.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params).fetchone()
    assert row is not None
    return row[0]


def _recorded(conn: psycopg.Connection[Any], schema: str, pid: int) -> bool:
    """Whether the worker process `pid` has registered and recorded its session."""
    where = f"pid = {int(pid)} AND session_pid IS NOT NULL"
    return count(conn, schema, "workers", where) == 1


def _running_again_within_the_promise(runs: Path, killed_at: float, case: str) -> None:
    """Wait for the job's second attempt to start, at most PROMISE seconds after the kill."""
    wait_until(
        lambda: _lines(runs, "attempt 2") == 1,
        timeout=max(PROMISE - (time.monotonic() - killed_at), 0.0),
        what=f"the job's second attempt within {PROMISE:g} s of the kill ({case})",
    )
    print(f"\n{case}: running again {time.monotonic() - killed_at:.2f} s after the kill")


def _check_rescued_once(conn: psycopg.Connection[Any], schema: str) -> None:
    wait_until(lambda: count(conn, schema, "job_history") == 1, what="the job's end")
    status, attempt, errors = conn.execute(
        sql.SQL("SELECT status, attempt, errors FROM {s}.job_history").format(
            s=sql.Identifier(schema)
        )
    ).fetchone()  # type: ignore[misc]
    (lost,) = errors
    assert (status, attempt, lost["kind"]) == ("succeeded", 2, "lost")
    assert "session ended" in lost["error"], lost["error"]


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=30)


@pytest.mark.alone  # the promise is a deadline: no other test slows the start
def test_a_lone_worker_killed_and_restarted_runs_its_job_again_within_seconds(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """The commonest death: one worker, restarted by its supervisor. Its replacement finds
    the dead worker's session gone at its first look, though it never saw it beat."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    first = settings_worker_process(dsn, schema, SETTINGS, log=tmp_path / "first.log", env=env)
    procs = [first]
    queue = Queue(dsn, schema=schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: _recorded(conn, schema, first.pid), what="the worker's session")
            queue.enqueue_many([apps.stall_once.job()])
            wait_until(lambda: _lines(runs, "attempt 1") == 1, what="the job's first attempt")
            killed_at = time.monotonic()
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            procs.append(
                settings_worker_process(dsn, schema, SETTINGS, log=tmp_path / "second.log", env=env)
            )
            _running_again_within_the_promise(runs, killed_at, "lone worker restarted")
            _check_rescued_once(conn, schema)
            assert count(conn, schema, "workers") == 1  # the dead worker's row went with it
    finally:
        queue.close()
        _stop(procs)


@pytest.mark.alone  # the promise is a deadline: no other test slows the start
def test_a_worker_killed_a_second_after_another_started_runs_its_job_again_within_seconds(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A rolling deploy: the old worker dies before the new one has seen it beat."""
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    old = settings_worker_process(dsn, schema, SETTINGS, log=tmp_path / "old.log", env=env)
    procs = [old]
    queue = Queue(dsn, schema=schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: _recorded(conn, schema, old.pid), what="the old worker's session")
            queue.enqueue_many([apps.stall_once.job()])
            wait_until(lambda: _lines(runs, "attempt 1") == 1, what="the job's first attempt")
            new = settings_worker_process(dsn, schema, SETTINGS, log=tmp_path / "new.log", env=env)
            procs.append(new)
            wait_until(lambda: _recorded(conn, schema, new.pid), what="the new worker's start")
            wait_until(
                lambda: _one(
                    conn,
                    "SELECT now() - started_at >= interval '1 second' FROM {s}.workers"
                    " WHERE pid = %s",
                    schema,
                    new.pid,
                ),
                what="a second since the new worker registered",
            )
            killed_at = time.monotonic()
            old.send_signal(signal.SIGKILL)
            old.wait(timeout=30)
            _running_again_within_the_promise(runs, killed_at, "killed 1 s after another started")
            _check_rescued_once(conn, schema)
        assert (runs / f"runs-{new.pid}.txt").read_text().splitlines()[-1].endswith("attempt 2")
    finally:
        queue.close()
        _stop(procs)


def test_a_live_worker_whose_session_is_ended_records_its_new_one_and_keeps_its_job(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """The race a rescuer must lose: the worker's session is gone while another worker looks,
    and the worker, frozen until the rescuer has seen it so, records a new one within the
    grace. Then its session is ended again and again without a freeze."""
    runs = tmp_path / "runs"
    runs.mkdir()
    log = tmp_path / "live.log"
    queue = Queue(dsn, schema=schema)
    queue.enqueue_many([apps.sleepy.job(8.0)])
    queue.close()
    live = settings_worker_process(
        dsn, schema, SETTINGS | {"concurrency": 1}, log=log, env={"PGQUEUE_TEST_RUNS": str(runs)}
    )

    def session() -> tuple[int, Any]:
        row = conn.execute(
            sql.SQL("SELECT session_pid, session_start FROM {s}.workers WHERE pid = %s").format(
                s=sql.Identifier(schema)
            ),
            [live.pid],
        ).fetchone()
        assert row is not None
        return (row[0], row[1])

    def new_session(old: tuple[int, Any]) -> bool:
        now = session()
        return now[0] is not None and now != old

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: _lines(runs, "start") == 1, what="the job to start")
            live_id = _one(conn, "SELECT id FROM {s}.workers WHERE pid = %s", schema, live.pid)
            # Serves another queue: the job stays the live worker's unless rescued.
            other = Worker(apps.queue, dsn=dsn, schema=schema, queues=("elsewhere",), **SETTINGS)
            with worker_in_thread(other, force=True):
                wait_until(lambda: other.id > 0, what="the rescuing worker's registration")
                old = session()
                # Frozen, the worker cannot record a new session until the rescuer has seen
                # the old one gone; then it must, within the grace.
                live.send_signal(signal.SIGSTOP)
                try:
                    conn.execute("SELECT pg_terminate_backend(%s)", [old[0]])
                    wait_until(
                        lambda: live_id in other.current.rescuer.gone.suspects,
                        what="the rescuer seeing the live worker's session gone",
                    )
                finally:
                    live.send_signal(signal.SIGCONT)
                wait_until(lambda: new_session(old), what="the live worker's new session")
                for _ in range(5):
                    old = session()
                    conn.execute("SELECT pg_terminate_backend(%s)", [old[0]])
                    wait_until(
                        lambda old=old: new_session(old),
                        what="the live worker's new session",
                    )
                wait_until(lambda: count(conn, schema, "job_history") == 1, what="the job's end")
                assert other.load().rescued == 0
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


def test_a_beat_on_a_connection_that_names_another_backend_records_no_session(
    dsn: str, schema: str
) -> None:
    """What a pooler looks like to the heartbeat (test_pgbouncer.py has the real one): the
    pid the server named at connect is not the backend running the beat. No session is
    recorded, and no rescuer can take the worker for dead by it."""
    store = WorkersStore(schema)
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn) as other:
        elsewhere = other.info.backend_pid
        assert not store.heartbeat(conn, BeatParams(identity, 1, client_pid=elsewhere)).recorded
        assert not store.heartbeat(conn, BeatParams(identity, 1)).recorded
        assert count(conn, schema, "workers", "session_pid IS NOT NULL") == 0
        own = conn.info.backend_pid
        assert store.heartbeat(conn, BeatParams(identity, 1, client_pid=own)).recorded
        assert _one(conn, "SELECT session_pid FROM {s}.workers", schema) == own


def test_a_worker_is_registered_with_the_session_it_registers_on(dsn: str, schema: str) -> None:
    """So that it can be found dead by its session before its heartbeat's first beat."""
    store = WorkersStore(schema)
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)

    async def register(session: bool) -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return conn.info.backend_pid, await store.register(conn, identity, session=session)

    with psycopg.connect(dsn, autocommit=True) as conn:
        pid, worker_id = asyncio.run(register(True))
        assert (
            _one(conn, "SELECT session_pid FROM {s}.workers WHERE id = %s", schema, worker_id)
            == pid
        )
        _, worker_id = asyncio.run(register(False))  # polling through PgBouncer
        assert (
            _one(conn, "SELECT session_pid FROM {s}.workers WHERE id = %s", schema, worker_id)
            is None
        )


def test_sessions_that_ended_with_a_crash_restart_a_restart_or_a_failover_are_left_to_the_lease(
    server_folder: Path,
) -> None:
    """Every session ends with the server, and live workers lag in reconnecting: none is taken
    for dead by a session from before the server's last start, or its last crash restart (a
    backend killed, which restarts every other), or recorded on another server (a failover,
    simulated). A session that began after a restart still counts."""
    from pgqueue import embedded

    server = embedded.start(server_folder / "crashing")  # its own server: others are unaffected
    store = WorkersStore("pgqueue")
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)

    def record(worker_id: int) -> psycopg.Connection[Any]:
        conn = psycopg.connect(server.dsn, autocommit=True)
        store.heartbeat(conn, BeatParams(identity, worker_id, client_pid=conn.info.backend_pid))
        return conn

    async def gone() -> list[int]:
        async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
            return [g.worker_id for g in await store.sessions_gone(conn, 0)]

    def incarnation() -> Any:
        """When the server last started or crash-restarted; None while it cannot be reached."""
        try:
            with psycopg.connect(server.dsn) as conn:
                return conn.execute(
                    "SELECT pg_postmaster_start_time(), stats_reset FROM pg_stat_archiver"
                ).fetchone()
        except psycopg.OperationalError:
            return None

    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            apply(conn, "pgqueue")
        for worker_id, end_all in ((1, "crash"), (2, "restart")):
            was = incarnation()
            before = record(worker_id)
            assert asyncio.run(gone()) == []
            if end_all == "crash":
                os.kill(before.info.backend_pid, signal.SIGKILL)
            else:
                server.restart()
            wait_until(
                lambda: incarnation() not in (None, was),  # noqa: B023 - called in this round
                what=f"the server back after its {end_all}",
            )
            before.close()
            assert asyncio.run(gone()) == [], end_all
            record(worker_id + 10).close()
            assert asyncio.run(gone()) == [worker_id + 10], end_all
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute("DELETE FROM pgqueue.workers WHERE id = %s", [worker_id + 10])
        # A failover: the session was recorded on the server that is gone.
        with record(3) as failed_over:
            failed_over.execute(
                "UPDATE pgqueue.workers SET session_server_start = '2000-01-01' WHERE id = 3"
            )
        assert asyncio.run(gone()) == []
    finally:
        server.stop()
