"""A worker warns, at most once a minute, while a transaction holds back the xmin horizon."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from pgqueue import Queue, Worker
from pgqueue.migrate import apply
from tests.conftest import wait_until

# Run on each server CI tests against: the horizon is read from the server's statistics views.
pytestmark = pytest.mark.each_server


@pytest.fixture
def own_queue(own_database: str) -> Iterator[Queue]:
    """A queue in a database of its own: the horizon report lists only this database's
    sessions, so nothing else can be its oldest holder."""
    with psycopg.connect(own_database, autocommit=True) as conn:
        apply(conn, "pgqueue")
    queue = Queue(own_database)
    yield queue
    queue.close()


def _run_until(worker: Worker, checks: int) -> None:
    thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
    thread.start()
    try:
        wait_until(lambda: worker.horizon_checks >= checks, what=f"{checks} horizon checks")
    finally:
        worker.stop()
        thread.join(30)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "xmin horizon" in r.getMessage()]


def test_worker_warns_once_naming_the_transaction_that_holds_the_horizon(
    own_queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    assert own_queue.dsn is not None
    app = f"pgq-test-horizon-{uuid.uuid4().hex[:6]}"
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    with psycopg.connect(own_queue.dsn, application_name=app) as idle:
        idle.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        idle.execute("SELECT count(*) FROM pg_class")  # takes the snapshot, then sits idle
        worker = Worker(own_queue, dsn=own_queue.dsn, rescue_interval=0.05, horizon_warning=0.01)
        _run_until(worker, 10)
        pid = idle.info.backend_pid
        idle.rollback()
    (warning,) = _warnings(caplog)  # one, however many checks ran: rate-limited
    assert f"pid={pid} application={app!r} state=idle in transaction" in warning


def test_worker_stays_quiet_while_no_transaction_is_older_than_the_threshold(
    own_queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    assert own_queue.dsn is not None
    caplog.set_level(logging.WARNING, logger="pgqueue.worker")
    with psycopg.connect(own_queue.dsn) as idle:
        idle.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        idle.execute("SELECT 1")
        worker = Worker(own_queue, dsn=own_queue.dsn, rescue_interval=0.05, horizon_warning=3600)
        _run_until(worker, 5)
        idle.rollback()
    assert _warnings(caplog) == []
