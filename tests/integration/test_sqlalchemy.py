"""Enqueue in a SQLAlchemy Session's (or AsyncSession's, or Connection's) transaction: the
job commits and rolls back with the caller's work, savepoints included, and pgqueue never
commits or flushes for the caller. Real PostgreSQL, SQLAlchemy's own pool, a real worker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

sqlalchemy = pytest.importorskip("sqlalchemy", reason="pip install 'pgqueue-py[sqlalchemy]'")

from sqlalchemy import Integer, String, create_engine, select, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column  # noqa: E402

from pgqueue import AsyncQueue, ConfigurationError, Queue  # noqa: E402
from pgqueue.testing import drain  # noqa: E402
from tests.apps import tasks as apps  # noqa: E402
from tests.conftest import count, run_python  # noqa: E402


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String(50))


@pytest.fixture
def engine(dsn: str, schema: str) -> Iterator[Any]:
    """An engine on the psycopg driver, with SQLAlchemy's own pool, whose connections use
    the test's schema for the orders table."""

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn)
        conn.execute(f'SET search_path TO "{schema}"')
        conn.commit()
        return conn

    eng = create_engine("postgresql+psycopg://", creator=connect, pool_size=2)
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def _jobs(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        return count(conn, schema, "jobs")


def test_a_job_commits_and_rolls_back_with_the_session(engine: Any, dsn: str, schema: str) -> None:
    queue = Queue(schema=schema)
    with Session(engine) as session:
        session.add(Order(id=1, item="tea"))
        session.flush()
        job = queue.enqueue(apps.noop.job(), conn=session)
        assert _jobs(dsn, schema) == 0  # not visible before the session commits
        session.commit()
    assert _jobs(dsn, schema) == 1
    with Session(engine) as session:
        session.add(Order(id=2, item="cake"))
        queue.enqueue(apps.noop.job(), conn=session)
        session.rollback()
    assert _jobs(dsn, schema) == 1
    drain(apps.queue, dsn=dsn, schema=schema)
    done = Queue(dsn, schema=schema)
    record = done.get_job(job)
    assert record is not None and record.status.value == "succeeded"
    done.close()


def test_begin_blocks_nested_savepoints_and_nothing_flushed_for_the_caller(
    engine: Any, dsn: str, schema: str
) -> None:
    queue = Queue(schema=schema)
    with Session(engine) as session, session.begin():
        pending = Order(id=3, item="jam")
        session.add(pending)
        kept = queue.enqueue(apps.noop.job(), conn=session)
        assert pending in session.new  # enqueue did not flush the caller's pending object
        nested = session.begin_nested()
        queue.enqueue(apps.noop.job(), conn=session)
        nested.rollback()  # the savepoint's job goes, the block's stays
        queue.enqueue_many([apps.noop.job(), apps.noop.job()], conn=session)
    with Session(engine) as session:
        assert session.scalars(select(Order.item)).all() == ["jam"]
    assert _jobs(dsn, schema) == 3
    with psycopg.connect(dsn) as conn:
        ids = [r[0] for r in conn.execute(f'SELECT id FROM "{schema}".jobs ORDER BY id')]
    assert ids[0] == kept and len(ids) == 3


def test_a_core_connection_in_commit_as_you_go_mode(engine: Any, dsn: str, schema: str) -> None:
    queue = Queue(schema=schema)
    with engine.connect() as conn:
        queue.enqueue(apps.noop.job(), conn=conn)  # begins its transaction, as execute would
        conn.execute(text("INSERT INTO orders (id, item) VALUES (4, 'bun')"))
        conn.rollback()
        queue.enqueue(apps.noop.job(), conn=conn)
        conn.commit()
    assert _jobs(dsn, schema) == 1


def test_async_session_commits_rolls_back_and_keeps_savepoints(
    dsn: str, schema: str, engine: Any
) -> None:
    async def scenario() -> None:
        async def connect() -> psycopg.AsyncConnection[Any]:
            conn = await psycopg.AsyncConnection.connect(dsn)
            await conn.execute(f'SET search_path TO "{schema}"')
            await conn.commit()
            return conn

        eng = create_async_engine("postgresql+psycopg://", async_creator=connect)
        queue = AsyncQueue(schema=schema)
        async with AsyncSession(eng) as session:
            session.add(Order(id=5, item="pie"))
            await queue.enqueue(apps.noop.job(), conn=session)
            nested = await session.begin_nested()
            await queue.enqueue(apps.noop.job(), conn=session)
            await nested.rollback()
            await session.commit()
        async with AsyncSession(eng) as session:
            await queue.enqueue(apps.noop.job(), conn=session)
            await session.rollback()
        async with eng.connect() as conn:
            await queue.enqueue(apps.noop.job(), conn=conn)
            await conn.commit()
        await eng.dispose()

    asyncio.run(scenario())
    assert _jobs(dsn, schema) == 2


def test_other_drivers_and_mixed_up_kinds_get_a_clear_error(engine: Any, schema: str) -> None:
    queue = Queue(schema=schema)
    with (
        Session(create_engine("sqlite://")) as session,
        pytest.raises(ConfigurationError, match=r"sqlite\+pysqlite.*postgresql\+psycopg://"),
    ):
        queue.enqueue(apps.noop.job(), conn=session)

    async def wrong_kind() -> None:
        with Session(engine) as session:
            await AsyncQueue(schema=schema).enqueue(apps.noop.job(), conn=session)  # type: ignore[arg-type]

    with pytest.raises(ConfigurationError, match="goes with Queue"):
        asyncio.run(wrong_kind())


def test_asyncpg_is_refused_naming_the_driver_to_use(dsn: str, schema: str) -> None:
    asyncpg = pytest.importorskip("asyncpg", reason="asyncpg is not installed")

    async def scenario() -> None:
        eng = create_async_engine(
            "postgresql+asyncpg://", async_creator=lambda: asyncpg.connect(dsn)
        )
        try:
            async with AsyncSession(eng) as session:
                with pytest.raises(
                    ConfigurationError, match=r"postgresql\+asyncpg.*postgresql\+psycopg://"
                ):
                    await AsyncQueue(schema=schema).enqueue(apps.noop.job(), conn=session)
        finally:
            await eng.dispose()

    asyncio.run(scenario())


FRESH_PROCESS = """
import sys
import psycopg
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from pgqueue import Queue

dsn, schema = sys.argv[1:]
assert "pgqueue.contrib.sqlalchemy" not in sys.modules
queue = Queue(schema=schema)
queue.task(name="noop")(lambda: None)
engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
with Session(engine) as session:
    queue.enqueue("noop", conn=session)
    session.commit()
engine.dispose()
print("pgqueue.contrib.sqlalchemy" in sys.modules)
"""


def test_a_session_is_taken_without_the_application_importing_the_integration(
    dsn: str, schema: str
) -> None:
    result = run_python("-c", FRESH_PROCESS, dsn, schema)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"  # found through pgqueue's entry point
    assert _jobs(dsn, schema) == 1
