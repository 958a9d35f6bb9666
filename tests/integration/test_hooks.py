"""Hooks (pgqueue/hooks.py): an enqueue hook is around every batch an enqueue stores, sees
the batch before it is stored and its ids after, in the caller's transaction; unregistered, it
sees nothing more. A connection adapter lets `conn=` take another library's object. Real
PostgreSQL, no mock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, ConfigurationError, Enqueued, Queue, hooks
from pgqueue.models import NewJob
from tests.apps import tasks as apps
from tests.conftest import count


class Recorder:
    """An enqueue hook that keeps each batch it saw, with the ids stored for it and whether
    the batch's jobs were in the database yet when it was entered."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.seen: list[tuple[list[str], list[int], int]] = []

    @contextmanager
    def enqueue(self, batch: Sequence[NewJob]) -> Iterator[list[int]]:
        with psycopg.connect(self.dsn) as conn:
            before = count(conn, self.schema, "jobs")
        ids: list[int] = []
        try:
            yield ids
        finally:
            self.seen.append(([job.task for job in batch], list(ids), before))


@pytest.fixture
def recorder(dsn: str, schema: str) -> Iterator[Recorder]:
    hook = Recorder(dsn, schema)
    hooks.register(hook)
    yield hook
    hooks.unregister(hook)


def test_an_enqueue_hook_sees_each_batch_and_its_ids(
    recorder: Recorder, queue: Queue, dsn: str, schema: str
) -> None:
    one = queue.enqueue(apps.noop.job())
    many = queue.enqueue_many([apps.record.job(i) for i in range(3)])
    copied = queue.enqueue_many([apps.noop.job() for _ in range(70)])  # by COPY
    assert recorder.seen == [
        (["noop"], [one], 0),
        (["record"] * 3, many, 1),
        (["noop"] * 70, copied, 4),
    ]


def test_an_enqueue_hook_runs_in_the_callers_transaction(
    recorder: Recorder, queue: Queue, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        job = queue.enqueue(apps.noop.job(), conn=conn)
        conn.rollback()
    assert recorder.seen == [(["noop"], [job], 0)]
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 0


def test_an_unregistered_hook_sees_nothing_more(
    recorder: Recorder, queue: Queue, dsn: str, schema: str
) -> None:
    queue.enqueue(apps.noop.job())
    hooks.unregister(recorder)
    hooks.unregister(recorder)  # a second time: nothing happens
    queue.enqueue(apps.noop.job())
    assert len(recorder.seen) == 1
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 2


def test_two_hooks_are_entered_in_order_and_each_given_the_ids(
    recorder: Recorder, dsn: str, schema: str
) -> None:
    second = Recorder(dsn, schema)
    hooks.register(second)
    hooks.register(second)  # registered once
    try:

        async def scenario() -> list[Enqueued]:
            queue = AsyncQueue(dsn, schema=schema)
            try:
                return await queue.enqueue_many([apps.noop.job(), apps.noop.job()])
            finally:
                await queue.close()

        ids = asyncio.run(scenario())
    finally:
        hooks.unregister(second)
    assert recorder.seen == second.seen == [(["noop", "noop"], ids, 0)]


def test_a_failed_enqueue_leaves_the_hooks_ids_empty(recorder: Recorder, queue: Queue) -> None:
    with pytest.raises(TypeError, match=r"Queue needs a psycopg\.Connection, got str"):
        queue.enqueue(apps.noop.job(), conn="not a connection")  # type: ignore[arg-type]
    assert recorder.seen == [(["noop"], [], 0)]


class Wrapped:
    """Another library's connection object, as far as pgqueue can tell: it holds the psycopg
    connection it runs on."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.inner = conn


class WrappedAdapter:
    library = Wrapped.__module__.partition(".")[0]

    def connection(self, conn: object) -> psycopg.Connection[Any]:
        if not isinstance(conn, Wrapped):
            raise ConfigurationError(f"not a Wrapped: {type(conn).__name__}")
        return conn.inner

    async def async_connection(self, conn: object) -> psycopg.AsyncConnection[Any]:
        raise ConfigurationError("Wrapped goes with Queue")


def test_a_connection_adapter_lets_conn_take_another_librarys_object(
    queue: Queue, dsn: str, schema: str
) -> None:
    adapter = WrappedAdapter()
    with psycopg.connect(dsn) as conn:
        with pytest.raises(TypeError, match="got Wrapped"):
            queue.enqueue(apps.noop.job(), conn=Wrapped(conn))  # type: ignore[arg-type]
        hooks.register(adapter)
        try:
            job = queue.enqueue(apps.noop.job(), conn=Wrapped(conn))  # type: ignore[arg-type]
            assert count(conn, schema, "jobs") == 1  # in the wrapped connection's transaction
            conn.commit()
        finally:
            hooks.unregister(adapter)
    record = queue.get_job(job)
    assert record is not None and record.task == "noop"


def test_registering_what_is_no_hook_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="is not a pgqueue hook"):
        hooks.register(object())  # type: ignore[arg-type]


class Entered:
    """An enqueue hook that notes its name in `order` each time it is entered, and keeps the
    ids of the batches it was around."""

    def __init__(self, name: str, order: list[str]) -> None:
        self.name = name
        self.order = order
        self.ids: list[list[int]] = []

    @contextmanager
    def enqueue(self, batch: Sequence[NewJob]) -> Iterator[list[int]]:
        self.order.append(self.name)
        ids: list[int] = []
        yield ids
        self.ids.append(list(ids))


def test_a_queues_own_hooks_run_for_its_enqueues_only_after_the_registered_ones(
    dsn: str, schema: str
) -> None:
    order: list[str] = []
    registered, own = Entered("registered", order), Entered("own", order)
    hooks.register(registered)
    hooked, plain = Queue(dsn, schema=schema, hooks=[own, own]), Queue(dsn, schema=schema)
    try:
        first = hooked.enqueue(apps.noop.job())
        second = plain.enqueue(apps.noop.job())
    finally:
        hooks.unregister(registered)
        hooked.close()
        plain.close()
    assert order == ["registered", "own", "registered"]
    assert own.ids == [[first]]
    assert registered.ids == [[first], [second]]


def test_an_async_queues_own_hooks_see_its_enqueues(dsn: str, schema: str) -> None:
    own = Entered("own", [])

    async def scenario() -> list[Enqueued]:
        queue = AsyncQueue(dsn, schema=schema, hooks=[own])
        try:
            return await queue.enqueue_many([apps.noop.job(), apps.noop.job()])
        finally:
            await queue.close()

    ids = asyncio.run(scenario())
    assert own.ids == [ids]


def test_a_queue_refuses_hooks_that_are_no_enqueue_hooks(dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="is not an enqueue hook"):
        Queue(dsn, hooks=[object()])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="takes a list of enqueue hooks"):
        AsyncQueue(dsn, hooks=Entered("alone", []))  # type: ignore[arg-type]
