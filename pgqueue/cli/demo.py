"""`pgqueue demo`: transactional enqueue, shown on a small table.

Enqueues `jobs` orders with their job in committed transactions and as many in transactions
that roll back, then works the queue with a real Worker and checks that every committed job
ran once and no rolled-back job ran at all. Uses its own schema, recreated on each run, and
writes nothing outside it; since the database may be the user's own (PGQUEUE_DSN), it says
which database and schema before it writes, and how to drop the schema once done.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import args_row, scalar_row
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pgqueue.cli.console import make_console
from pgqueue.errors import ConfigurationError as UsageError
from pgqueue.migrate import apply
from pgqueue.queue import Queue
from pgqueue.words import plural
from pgqueue.worker.worker import Worker


def run(dsn: str, *, jobs: int, concurrency: int, schema: str, source: str) -> int:
    """The demo on `dsn` (named by `source`, as the user gave it) in `schema`; 0 if it went
    as transactional enqueue promises, 1 if not."""
    # Markup on: the demo's own texts carry it, and it prints nothing of anyone else's.
    console = make_console(markup=True, emoji=True, soft_wrap=True)
    queue = Queue(dsn, schema=schema)
    ran: list[int] = []

    @queue.task(name="demo.process_order")
    async def process_order(order_id: int) -> int:
        ran.append(order_id)
        return order_id

    with psycopg.connect(dsn, autocommit=True) as conn:
        console.print(f"[bold]pgqueue demo[/] on {_server_version(conn)}")
        console.print(_where(conn, schema, source), highlight=False)
        _refuse_foreign_schema(conn, schema)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        apply(conn, schema)
        conn.execute(
            sql.SQL("CREATE TABLE {}.orders (id bigserial PRIMARY KEY, item text NOT NULL)").format(
                sql.Identifier(schema)
            )
        )

    started = time.perf_counter()
    committed, rolled_back = _enqueue(queue, process_order, dsn, schema, jobs, console)
    enqueue_seconds = time.perf_counter() - started
    console.print(
        f"enqueued {plural(jobs, 'job')} in committed transactions and {jobs:,} in rolled-back "
        f"ones in {enqueue_seconds:.1f} s"
    )

    logging.getLogger("pgqueue.job").setLevel(logging.WARNING)
    logging.getLogger("pgqueue.worker").setLevel(logging.WARNING)
    worker = Worker(queue, dsn=dsn, concurrency=concurrency, burst=True)
    with _progress(console) as progress:
        bar = progress.add_task("working", total=jobs)
        started = time.perf_counter()
        asyncio.run(_work(worker, lambda: progress.update(bar, completed=len(ran))))
        work_seconds = time.perf_counter() - started
        progress.update(bar, completed=len(ran))

    ran_set = set(ran)
    ran_committed = len(ran_set & committed)
    ran_rolled_back = len(ran_set & rolled_back)
    twice = len(ran) - len(ran_set)
    ok = ran_committed == jobs and ran_rolled_back == 0 and twice == 0
    console.print(f"jobs that ran:                          {ran_committed} of {jobs}")
    console.print(f"jobs from rolled-back transactions run: {ran_rolled_back} (must be 0)")
    console.print(f"jobs that ran twice:                    {twice} (must be 0)")
    console.print(
        f"throughput: {len(ran) / work_seconds:,.0f} jobs/s "
        f"({plural(len(ran), 'job')} in {work_seconds:.2f} s, concurrency {concurrency})"
    )
    console.print("[green]OK[/]" if ok else "[red]FAILED[/]")
    console.print(
        f"The demo's tables stay in schema {schema} for you to look at; remove them with: "
        f"DROP SCHEMA {_quoted(schema)} CASCADE;",
        highlight=False,
    )
    queue.close()
    return 0 if ok else 1


def _where(conn: psycopg.Connection[Any], schema: str, source: str) -> str:
    """Which database and schema the demo is about to write to, and that nothing else is."""
    info = conn.info
    return (
        f"database {info.dbname} on {info.host}:{info.port} as {info.user} (from {source}), "
        f"schema {schema}: the demo's own, dropped and recreated on each run; nothing else "
        "in the database is touched (--schema picks another)"
    )


def _quoted(schema: str) -> str:
    return sql.Identifier(schema).as_string(None)


@dataclass(frozen=True)
class _Tables:
    """How many tables the schema has, and how many of them are named orders."""

    tables: int
    orders: int


def _refuse_foreign_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """The demo recreates its schema; never drop one that is not a demo's own."""
    with conn.cursor(row_factory=args_row(_Tables)) as cur:
        found = cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE table_name = 'orders') "
            "FROM information_schema.tables WHERE table_schema = %s",
            [schema],
        ).fetchone()
    if found is not None and found.tables and not found.orders:
        raise UsageError(
            f"schema {schema!r} exists and is not a pgqueue demo schema (it has no orders "
            "table); the demo drops and recreates its schema, so pick another --schema"
        )


def _enqueue(
    queue: Queue, task: Any, dsn: str, schema: str, jobs: int, console: Console
) -> tuple[set[int], set[int]]:
    insert = sql.SQL("INSERT INTO {}.orders (item) VALUES (%s) RETURNING id").format(
        sql.Identifier(schema)
    )
    committed: set[int] = set()
    rolled_back: set[int] = set()
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor(row_factory=scalar_row) as cur,
        _progress(console) as progress,
    ):
        bar = progress.add_task("enqueueing", total=2 * jobs)
        for i in range(2 * jobs):
            keep = i % 2 == 0
            order: int | None = cur.execute(insert, [f"order {i}"]).fetchone()
            assert order is not None
            queue.enqueue(task.job(order), conn=conn)
            if keep:
                conn.commit()
                committed.add(order)
            else:
                conn.rollback()
                rolled_back.add(order)
            if i % 100 == 0:
                progress.update(bar, completed=i)
        progress.update(bar, completed=2 * jobs)
    return committed, rolled_back


async def _work(worker: Worker, tick: Any) -> None:
    runner = asyncio.create_task(worker.run_async())
    while not runner.done():
        tick()
        await asyncio.wait([runner], timeout=0.1)
    await runner


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=not sys.stdout.isatty(),
    )


def _server_version(conn: psycopg.Connection[Any]) -> str:
    with conn.cursor(row_factory=scalar_row) as cur:
        version = cur.execute("SHOW server_version").fetchone()
    return f"PostgreSQL {version or '?'}"
