"""Fixtures: one real PostgreSQL per session, a fresh schema per test.

PGQUEUE_TEST_DSN selects a server; without it the embedded PostgreSQL starts in a temporary
directory. Nothing here mocks the database.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.migrate import apply
from pgqueue.models import WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import ClaimParams
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.observe import WorkerStats

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Each run's temporary root is a folder of its own, removed at the end: under pytest's
    shared root, a second run started meanwhile pruned this one's folders, and with them the
    data of embedded servers that tests had started there."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="pgqueue-pytest-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))


def pytest_report_header() -> str:
    given = os.environ.get("PGQUEUE_TEST_DSN")
    return f"database: {given}" if given else "database: embedded PostgreSQL (temporary)"


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    """The server's DSN. The embedded server's data lives in a directory of its own, not
    under pytest's temporary root: pytest keeps only the last three sessions' folders there,
    so a second pytest run started meanwhile deleted a running server's data."""
    given = os.environ.get("PGQUEUE_TEST_DSN")
    if given and os.environ.get("PYTEST_XDIST_WORKER"):
        # Parallel workers on one server each get a database: a test's held snapshot or
        # terminated session then reaches only its own worker's tests, as on a server alone.
        with database_of_its_own(given) as made:
            yield made
        return
    if given:
        yield given
        return
    from pgqueue import embedded

    with tempfile.TemporaryDirectory(prefix="pgqueue-tests-") as folder:
        server = embedded.start(Path(folder) / "data")
        print(
            f"\ntests: PGQUEUE_TEST_DSN not set; started the embedded PostgreSQL in "
            f"{server.data_dir}",
            file=sys.__stderr__,
        )
        try:
            yield server.dsn
        finally:
            server.stop()


@pytest.fixture
def server_folder() -> Iterator[Path]:
    """A folder for a test's own embedded server, outside pytest's temporary root for the
    reason `dsn` gives: another pytest run pruning old folders there deleted a running
    server's data."""
    with tempfile.TemporaryDirectory(prefix="pgqueue-server-") as folder:
        yield Path(folder)


@pytest.fixture(scope="session")
def server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version


def new_schema(dsn: str) -> str:
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        apply(conn, name)
    return name


def drop_schema(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = new_schema(dsn)
    yield name
    drop_schema(dsn, name)


@pytest.fixture
def own_database(dsn: str) -> Iterator[str]:
    """The DSN of a database made for this test alone, for tests that terminate sessions
    (their reach is one database, and the server may be shared with other work)."""
    with database_of_its_own(dsn) as made:
        yield made


@contextlib.contextmanager
def database_of_its_own(dsn: str) -> Iterator[str]:
    """A new database on the server of `dsn`, dropped afterwards; yields its DSN."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["dbname"] = name
    yield psycopg.conninfo.make_conninfo("", **info)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
def queue(dsn: str, schema: str) -> Iterator[Queue]:
    q = Queue(dsn, schema=schema)
    yield q
    q.close()


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn) as c:
        yield c


@contextlib.contextmanager
def session(dsn: str, app: str, *, hold_horizon: bool) -> Iterator[psycopg.Connection[Any]]:
    """A connection named `app`; with hold_horizon, left idle in a REPEATABLE READ
    transaction whose snapshot holds back the xmin horizon until it is closed."""
    conn = psycopg.connect(dsn, autocommit=True, application_name=app)
    try:
        if hold_horizon:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT 1")
        yield conn
    finally:
        conn.close()


@contextlib.contextmanager
def worker_in_thread(worker: Any, *, force: bool = False) -> Iterator[Any]:
    """Run a Worker on its own event loop in a thread; stop it (at once with `force`) and
    check that it ended when the block exits."""
    import asyncio
    import threading

    thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(force=force)
        thread.join(timeout=60)
        assert not thread.is_alive()


FLOOR = (-32768, 0)  # below every (priority, id), as in pgqueue.worker.claimer
CEILING = (32767, 2**63 - 1)  # above every (priority, id)


def claim_params(
    queue: str = "default",
    limit: int = 10,
    worker_id: int = 1,
    after: tuple[int, int] = FLOOR,
    before: tuple[int, int] = CEILING,
) -> dict[str, Any]:
    """job_claim's parameters for one claim of `queue` between two (priority, id) positions
    (by default, everything), as a worker sends them."""
    return ClaimParams(queue, after, before, limit, worker_id).as_params()


@contextlib.asynccontextmanager
async def claimer_by_hand(
    dsn: str, schema: str, steady: bool = True
) -> AsyncIterator[tuple[Claimer, psycopg.Connection[Any]]]:
    """A real worker Claimer for claims made by hand (claim_round), with a worker row of its
    own and its queue "default" steady or not, and an autocommit connection beside it."""
    link = Link(dsn, "claim")
    await link.open()
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
                    " VALUES ('test', 'test', 1, ARRAY['default'], 10) RETURNING id"
                ).format(sql.Identifier(schema))
            ).fetchone()
            assert row is not None
            claimer = Claimer(link, schema, WorkerSettings(), row[0], WorkerStats())
            claimer.hints.steady = {"default"} if steady else set()
            yield claimer, conn
    finally:
        await link.close()


def listen_for_wakes(
    conn: psycopg.Connection[Any], schema: str, queues: tuple[str, ...] = ("default",)
) -> None:
    """LISTEN on `schema`'s wake-up channel (autocommit `conn`) as a waiting worker does: with
    a worker row whose wake_listeners rows skip no wake-up of `queues`, since enqueues notify
    only when some worker wants the notice (sql/migrations/0015_quiet_wake.sql)."""
    from pgqueue.queries import channel

    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
            " VALUES ('test listener', 'test', pg_backend_pid(), %s, 1) RETURNING id"
        ).format(sql.Identifier(schema)),
        [list(queues)],
    ).fetchone()
    assert row is not None
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.wake_listeners (worker_id, queue, below, above)"
            " SELECT %s, unnest(%s::text[]), 32768, 32767"
        ).format(sql.Identifier(schema)),
        [row[0], list(queues)],
    )


def count(conn: psycopg.Connection[Any], schema: str, table: str, where: str = "true") -> int:
    """Rows in schema.table matching a literal condition written by the test itself."""
    query = sql.SQL("SELECT count(*) FROM {}.{} WHERE " + where).format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def function_calls(conn: psycopg.Connection[Any], schema: str, function: str) -> int:
    """Calls of schema.function counted so far by sessions that have handed theirs over (a
    session counts them with track_functions on, and hands them over as it ends)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = %s AND funcname = %s",
        [schema, function],
    ).fetchone()
    return int(row[0]) if row else 0


def committed(conn: psycopg.Connection[Any]) -> bool:
    """End `conn`'s transaction, so the next read of a wait_until predicate sees new rows."""
    conn.commit()
    return True


def wait_until(predicate: Any, timeout: float = 60.0, what: str = "condition") -> None:
    """Wait for a state the test can observe (a row count, a file), up to `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def env_without_dsn(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment less PGQUEUE_DSN and DATABASE_URL, so only what a test passes names a
    database, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    return env | (extra or {})


def run_python(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 120
) -> Any:
    """`python ARGS` as a real process in `cwd`, with no DSN inherited; its output captured."""
    import subprocess

    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env_without_dsn(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def stop_worker_processes(procs: list[Any]) -> None:
    """SIGTERM every worker process, then wait for each: a worker stops cleanly on it."""
    import signal

    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=60)


def clean_exit_logs(procs: list[Any], logs: list[Path]) -> list[str]:
    """Each stopped worker's output, after checking it exited 0 with no traceback or error."""
    outputs = []
    for proc, log in zip(procs, logs, strict=True):
        output = log.read_text()
        assert proc.returncode == 0, output[-3000:]
        assert "Traceback" not in output and " ERROR " not in output, output[-3000:]
        outputs.append(output)
    return outputs


def worker_process(
    dsn: str,
    schema: str,
    *args: str,
    log: Path,
    env: dict[str, str] | None = None,
    app: str = "tests.apps.tasks:queue",
) -> Any:
    """`python -m pgqueue worker tests.apps.tasks:queue` (or `app`) as a real process, its output
    in `log`.

    Output goes to a file, not a pipe: a pipe nobody reads fills up and blocks the worker.
    """
    import subprocess
    import sys

    full_env = env_without_dsn(env)
    with open(log, "w") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pgqueue",
                "worker",
                app,
                "--dsn",
                dsn,
                "--schema",
                schema,
                *args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def settings_worker_process(
    dsn: str, schema: str, settings: dict[str, Any], *, log: Path, env: dict[str, str] | None = None
) -> Any:
    """tests/apps/run_worker.py as a real process: a Worker with any settings, output in `log`."""
    import json
    import subprocess

    full_env = env_without_dsn(env)
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.apps.run_worker", dsn, schema, json.dumps(settings)],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )


def free_port() -> int:
    """A TCP port nothing listens on now, for a server a test starts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def relay_until(relay: Any, done: Any, timeout: float = 60) -> None:
    """Run a pgqueue.relay.Relay in this process until `done()`, then stop it."""
    import asyncio

    async def run() -> None:
        task = asyncio.create_task(relay.run())
        try:
            await asyncio.wait_for(_until(done, task), timeout)
        finally:
            relay.stop()
            await task

    async def _until(predicate: Any, task: Any) -> None:
        while not predicate() and not task.done():
            await asyncio.sleep(0.05)

    asyncio.run(run())
