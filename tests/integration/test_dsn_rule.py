"""Which database a Queue or AsyncQueue uses when its code names none: PGQUEUE_DSN, then
DATABASE_URL, as the `pgqueue` command does; with neither, a ConfigurationError that says what
to set. Real environment variables, a real PostgreSQL, real enqueues."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, ConfigurationError, Queue
from tests.conftest import count

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nowhere"


def _enqueue_with_env_dsn(schema: str) -> int:
    queue = Queue(schema=schema)
    try:
        return queue.enqueue(queue.declare("env.sync").job()).id
    finally:
        queue.close()


async def _enqueue_async_with_env_dsn(schema: str) -> int:
    queue = AsyncQueue(schema=schema)
    try:
        return (await queue.enqueue(queue.declare("env.async").job())).id
    finally:
        await queue.close()


def test_queues_without_a_dsn_use_pgqueue_dsn_before_database_url(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, conn: psycopg.Connection[Any]
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    assert Queue().dsn == dsn and AsyncQueue().dsn == dsn
    ids = [_enqueue_with_env_dsn(schema), asyncio.run(_enqueue_async_with_env_dsn(schema))]
    assert all(ids)
    assert count(conn, schema, "jobs") == 2


def test_queues_without_a_dsn_fall_back_on_database_url(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, conn: psycopg.Connection[Any]
) -> None:
    monkeypatch.delenv("PGQUEUE_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    _enqueue_with_env_dsn(schema)
    asyncio.run(_enqueue_async_with_env_dsn(schema))
    assert count(conn, schema, "jobs") == 2


def test_an_empty_pgqueue_dsn_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", "")
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    assert Queue().dsn == UNREACHABLE


def test_a_dsn_given_in_code_wins_over_the_environment(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", UNREACHABLE)
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    queue = Queue(dsn, schema=schema)
    try:
        assert queue.enqueue(queue.declare("code.dsn").job()).id
    finally:
        queue.close()
    assert AsyncQueue(dsn).dsn == dsn


def test_with_no_dsn_anywhere_a_pooled_call_says_which_variables_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGQUEUE_DSN", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    queue = Queue()
    task = queue.declare("nowhere")
    with pytest.raises(ConfigurationError, match="set PGQUEUE_DSN or DATABASE_URL"):
        task.enqueue()
    with pytest.raises(ConfigurationError, match=r"Queue\(dsn=\.\.\.\)"):
        queue.migrate()

    async def pooled() -> None:
        aqueue = AsyncQueue()
        with pytest.raises(ConfigurationError, match="set PGQUEUE_DSN or DATABASE_URL"):
            await aqueue.enqueue(aqueue.declare("nowhere").job())
        with pytest.raises(ConfigurationError, match=r"AsyncQueue\(dsn=\.\.\.\)"):
            await aqueue.migrate()

    asyncio.run(pooled())
