"""The waiters of jobs' results: their rows, their channel and the outcomes they read. Runs
sql/queries/waits.sql, always on the one connection that a queue's waiters share
(pgqueue/queue/waiting.py): a row belongs to the session that LISTENs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from psycopg.rows import args_row

from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, execute
from pgqueue.values import tolerate


@dataclass(frozen=True)
class JobEnd:
    """A job that is no longer live: its final status, result and errors as history records
    them; status None when history has no record of it."""

    id: int
    status: str | None
    result: object
    errors: list[dict[str, object]]


class WaitsStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def listen(self, conn: AsyncConn) -> None:
        """Subscribe `conn` to the schema's done channel."""
        await execute(conn, query("wait_listen", self.schema))

    async def register(self, conn: AsyncConn, ids: Sequence[int]) -> None:
        """Have the finish of jobs `ids` notify this session."""
        await execute(conn, query("wait_register", self.schema), {"ids": list(ids)})

    async def unregister(self, conn: AsyncConn, ids: Sequence[int] | None) -> None:
        """End this session's waits for jobs `ids`; None: all of them."""
        params = {"ids": None if ids is None else list(ids)}
        await execute(conn, query("wait_unregister", self.schema), params)

    async def sweep(self, conn: AsyncConn) -> None:
        """Delete the rows of waiting sessions that are gone."""
        await execute(conn, query("wait_sweep", self.schema))

    async def outcomes(self, conn: AsyncConn, ids: Sequence[int]) -> list[JobEnd]:
        """Those of jobs `ids` that are no longer live, each as history records it."""
        async with conn.cursor(row_factory=args_row(_job_end)) as cur:
            tolerate(cur)  # a result Python cannot read still ends the wait, saying why
            await cur.execute(query("wait_outcomes", self.schema), {"ids": list(ids)})
            return await cur.fetchall()


def _job_end(id: int, status: str | None, result: object, errors: object) -> JobEnd:
    return JobEnd(int(id), status, result, _errors(errors))


def _errors(value: object) -> list[dict[str, object]]:
    if isinstance(value, list):
        return [e for e in value if isinstance(e, dict)]
    return [value] if isinstance(value, dict) else []  # an Unreadable errors column
