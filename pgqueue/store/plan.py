"""Plans: an operation of several statements written once for the sync and async twins.

A plan is a generator that yields (statement, params) and is sent back the rows. `run` and
`run_async` drive one on a sync or async connection, the only place the twins differ. A plan
reads each row as a frozen dataclass of its statement's columns (`rows_as`), never by
position. A plan whose statements must commit together runs, on an autocommit connection, in
a transaction of its own; otherwise in the caller's transaction, which it never commits.

`Pipelined` is the other shape: statements of which none needs another's rows, sent in one
round trip (psycopg's pipeline mode) and read together once all have run. The first error
among them is raised, and the server skipped the statements after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow, args_row, tuple_row

from pgqueue.values import tolerate

T = TypeVar("T")
Query = sql.Composed | bytes
Params = Mapping[str, object]
Step = tuple[Query, Params | None]
Rows = list[TupleRow]
Plan = Generator[Step, Rows, T]
# A connection of any row factory: the store reads through cursors with factories of its own.
SyncConn = psycopg.Connection[object]
AsyncConn = psycopg.AsyncConnection[object]


def _own_transaction(
    conn: SyncConn | AsyncConn, together: bool
) -> Any:  # a sync or async context manager, as the connection's kind
    """A transaction for statements that must commit together on an autocommit connection;
    none otherwise (a caller's transaction is never committed here)."""
    return conn.transaction() if together and conn.autocommit else contextlib.nullcontext()


def run(conn: SyncConn, plan: Plan[T], *, together: bool = True) -> T:
    """Drive `plan` on `conn`; `together=False` for a plan whose statements each stand alone
    (then an autocommit connection pays no BEGIN and COMMIT).

    The cursor is psycopg's own, whatever cursor class the connection makes: a framework's
    connection (Django's makes client-side binding cursors) then runs pgqueue's statements
    as pgqueue's own connections do, and prepares them where the connection allows it."""
    with _own_transaction(conn, together), psycopg.Cursor(conn, row_factory=tuple_row) as cur:
        tolerate(cur)  # a record holding what Python cannot represent still reads
        try:
            step = next(plan)
            while True:
                step = _resume(plan, _execute(cur, step))
        except StopIteration as stop:
            result: T = stop.value
            return result


async def run_async(conn: AsyncConn, plan: Plan[T], *, together: bool = True) -> T:
    """`run` on an async connection."""
    async with (
        _own_transaction(conn, together),
        psycopg.AsyncCursor(conn, row_factory=tuple_row) as cur,
    ):
        tolerate(cur)
        try:
            step = next(plan)
            while True:
                step = _resume(plan, await _execute_async(cur, step))
        except StopIteration as stop:
            result: T = stop.value
            return result


def _execute(cur: psycopg.Cursor[TupleRow], step: Step) -> Rows | psycopg.Error:
    try:
        cur.execute(*step)
        return cur.fetchall() if cur.description is not None else []
    except psycopg.Error as exc:
        return exc


async def _execute_async(cur: psycopg.AsyncCursor[TupleRow], step: Step) -> Rows | psycopg.Error:
    try:
        await cur.execute(*step)
        return await cur.fetchall() if cur.description is not None else []
    except psycopg.Error as exc:
        return exc


def _resume(plan: Plan[T], outcome: Rows | psycopg.Error) -> Step:
    """The plan's next step, given the rows of its last one or the error it raised; a plan
    may catch the error (a unique violation it expects) and go on."""
    if isinstance(outcome, psycopg.Error):
        return plan.throw(outcome)
    return plan.send(outcome)


@dataclass(frozen=True, slots=True)
class Pipelined(Generic[T]):
    """Statements sent together in one round trip, because none needs another's rows;
    `read` makes the result from each statement's rows, in order."""

    steps: tuple[Step, ...]
    read: Callable[[list[Rows]], T]


def run_pipelined(conn: SyncConn, work: Pipelined[T]) -> T:
    """Send `work`'s statements in one round trip, in whatever transaction the connection is
    in (they may end it and open the next); its result once all have run, or the first
    error among them."""
    with contextlib.ExitStack() as stack:
        cursors = [
            stack.enter_context(psycopg.Cursor(conn, row_factory=tuple_row)) for _ in work.steps
        ]
        with conn.pipeline():
            for cur, step in zip(cursors, work.steps, strict=True):
                tolerate(cur)
                cur.execute(*step)
        return work.read([cur.fetchall() if cur.description is not None else [] for cur in cursors])


async def run_pipelined_async(conn: AsyncConn, work: Pipelined[T]) -> T:
    """`run_pipelined` on an async connection."""
    async with contextlib.AsyncExitStack() as stack:
        cursors = [
            await stack.enter_async_context(psycopg.AsyncCursor(conn, row_factory=tuple_row))
            for _ in work.steps
        ]
        async with conn.pipeline():
            for cur, step in zip(cursors, work.steps, strict=True):
                tolerate(cur)
                await cur.execute(*step)
        return work.read(
            [await cur.fetchall() if cur.description is not None else [] for cur in cursors]
        )


def rows_as(kind: Callable[..., T], rows: Rows) -> list[T]:
    """A plan's rows as `kind`, each built from its columns in order: a frozen dataclass whose
    fields are the statement's columns."""
    return [kind(*row) for row in rows]


def one_as(kind: Callable[..., T], rows: Rows) -> T:
    """The one row of a statement that returns exactly one (an aggregate), as `kind`."""
    return _only(rows_as(kind, rows))


def _only(rows: list[T]) -> T:
    if len(rows) != 1:
        raise AssertionError(f"expected one row, got {len(rows)}")
    return rows[0]


async def execute(conn: AsyncConn, query: Query, params: Params | None = None) -> None:
    """Run one statement in the caller's transaction, reading none of its rows."""
    async with conn.cursor() as cur:
        await cur.execute(query, params)


async def fetch(
    conn: AsyncConn, kind: Callable[..., T], query: Query, params: Params | None = None
) -> list[T]:
    """Run one statement in the caller's transaction; its rows, each built as `kind` from
    its columns in order (psycopg's args_row: no row is a dict on the way)."""
    async with conn.cursor(row_factory=args_row(kind)) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()


async def fetch_one(
    conn: AsyncConn, kind: Callable[..., T], query: Query, params: Params | None = None
) -> T:
    """Run one statement that returns exactly one row (an aggregate); that row as `kind`."""
    return _only(await fetch(conn, kind, query, params))
