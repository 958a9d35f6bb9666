"""A worker's parts share one lifecycle: started in order, healthy while it runs, stopped in
reverse, and nothing of theirs left behind."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgqueue import DatabaseError, Queue, Worker
from tests.conftest import new_schema, wait_until, worker_in_thread

EXPECTED = [
    "claim",
    "complete",
    "registration",
    "heartbeat",
    "completer",
    "executor",
    "rescuer",
    "cancel watch",
    "progress",
    "horizon",
    "periodic",
    "history partitions",
    "pruner",
    "notifier",
]


def _sessions(dsn: str) -> list[str]:
    """The application names of pgqueue's sessions on this test's own database."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'pgqueue:%' "
            "ORDER BY 1"
        ).fetchall()
    return [row[0] for row in rows]


def test_every_service_runs_healthy_and_leaves_no_session_behind(own_database: str) -> None:
    schema = new_schema(own_database)
    queue = Queue(own_database, schema=schema)

    @queue.periodic(every=timedelta(hours=1))
    @queue.task(name="tick")
    def tick() -> None: ...

    worker = Worker(
        queue,
        dsn=own_database,
        history_retention=timedelta(days=1),
        rescue_interval=timedelta(seconds=1),
    )
    with worker_in_thread(worker):
        # Read anew: the run the worker holds is a new one once it starts.
        wait_until(
            lambda: len(worker.current.services.health()) == len(EXPECTED), what="all services"
        )
        health = worker.current.services.health()
        assert list(health) == EXPECTED
        assert all(h.ok for h in health.values()), health
        wait_until(
            lambda: (
                {"pgqueue:claim", "pgqueue:complete", "pgqueue:heartbeat"}
                <= set(_sessions(own_database))
            ),
            what="the worker's sessions",
        )
    queue.close()
    assert worker.current.services.health() == {}
    assert _sessions(own_database) == []


def test_a_worker_that_cannot_start_stops_what_it_started(own_database: str) -> None:
    """Registration refuses an unmigrated schema; the two connections opened before it are
    closed again."""
    queue = Queue(own_database, schema="never_migrated")
    worker = Worker(queue, dsn=own_database)
    caught: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(worker.run_async())
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], DatabaseError)
    assert "pgqueue migrate" in str(caught[0])
    assert _sessions(own_database) == []


@pytest.mark.parametrize("poll_only", [False, True])
def test_poll_only_leaves_out_the_notifier(dsn: str, schema: str, poll_only: bool) -> None:
    queue = Queue(dsn, schema=schema)
    worker = Worker(queue, dsn=dsn, poll_only=poll_only)
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims > 0, what="the first claim, after every start")
        names = list(worker.current.services.health())
    queue.close()
    assert ("notifier" in names) is not poll_only


def _callables(value: Any, depth: int = 2) -> Iterator[Any]:
    """The callables `value` holds: its own attributes and what its lists and dicts hold."""
    if callable(value) and not isinstance(value, type):
        yield value
    if depth == 0:
        return
    if isinstance(value, dict):
        inner: list[Any] = list(value.values())
    elif isinstance(value, (list, tuple, set)):
        inner = list(value)
    else:
        inner = list(getattr(value, "__dict__", {}).values())
    for item in inner:
        yield from _callables(item, depth - 1)


def _reaches(fn: Any, target: object) -> bool:
    """Whether calling `fn` calls into `target`: a method of it, or a closure over it."""
    if getattr(fn, "__self__", None) is target:
        return True
    cells = getattr(fn, "__closure__", None) or ()
    return any(cell.cell_contents is target for cell in cells if cell.cell_contents is not None)


def test_no_part_of_a_running_worker_holds_a_callback_into_it(dsn: str, schema: str) -> None:
    """The run wires its services; they talk through the run's events (worker/events.py),
    and none holds a method of the worker or the run, or a function over one, to call back."""
    queue = Queue(dsn, schema=schema)

    @queue.task(name="atomic", atomic=True)
    def atomic() -> None: ...

    worker = Worker(queue, dsn=dsn)
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims > 0, what="the first claim, after every start")
        run = worker.current
        parts = [
            *run.services,
            run.events,
            run.fetch_loop,
            run.inflight,
            run.claimer,
            run.interest,
            *run.atomic_lanes,
        ]
        assert "notifier" in run.services.health() and run.atomic_lanes
        held = [(part, fn) for part in parts for fn in _callables(part)]
        assert len(held) > 10
        into_worker = [
            (type(part).__name__, fn)
            for part, fn in held
            if _reaches(fn, worker) or _reaches(fn, run)
        ]
    queue.close()
    assert into_worker == []
