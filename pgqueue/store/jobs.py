"""The jobs table as a worker moves it: claims, promotions, outcomes, put-backs and rescues.

Every state change here is one statement guarded in its WHERE (status, worker, attempt), so a
late or duplicate write cannot move a job that another actor already moved. Runs the worker's
statements of sql/queries/jobs.sql on the worker's own connections; raises psycopg's errors
(a deadlock a caller may retry), never its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import psycopg

from pgqueue.models import ClaimedJob
from pgqueue.queries import query, statement
from pgqueue.registry import encode_json
from pgqueue.wakeup import Position

AsyncConn = psycopg.AsyncConnection[Any]


class OutcomeRow(Protocol):
    """What an outcome gives job_finish_many (executor.Outcome)."""

    def as_row(self) -> dict[str, Any]: ...


@dataclass
class Claimed:
    """One claim statement's result: the jobs to run, and the positions of the jobs it parked
    (their concurrency key is full); both count as walked."""

    jobs: list[ClaimedJob]
    parked: list[Position]

    @property
    def walked(self) -> int:
        return len(self.jobs) + len(self.parked)

    @property
    def top(self) -> Position | None:
        """The highest position among them, where the next claim may start."""
        tops = [(job.priority, job.id) for job in self.jobs] + self.parked
        return max(tops) if tops else None


@dataclass(frozen=True)
class Finished:
    finished: int
    retried: int
    archived: int


def finish_params(outcomes: Sequence[OutcomeRow], keep_history: bool) -> dict[str, Any]:
    """job_finish_many's parameters. Every writer of outcomes builds them here: the completer,
    the rescuer, an atomic lane (also on a sync connection) and a stopping worker."""
    return {
        "outcomes": encode_json([o.as_row() for o in outcomes]),
        "keep_history": keep_history,
        "now": None,
    }


class JobsStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def claim_unkeyed(self, conn: AsyncConn, params: dict[str, Any]) -> Claimed | None:
        """job_claim_unkeyed: the claim of a queue whose jobs carry no concurrency key. None
        when it met a keyed job and claimed nothing: claim with claim_keyed from then on."""
        cur = await conn.execute(statement("job_claim_unkeyed", self.schema), params)
        rows = await cur.fetchall()
        if rows and rows[0][8] is None:
            return None
        return Claimed([ClaimedJob(*row[:8]) for row in rows], [])

    async def claim_keyed(self, conn: AsyncConn, params: dict[str, Any]) -> Claimed:
        """job_claim: jobs that fit their key's limit are claimed, the others parked."""
        cur = await conn.execute(statement("job_claim", self.schema), params)
        claimed = Claimed([], [])
        for row in await cur.fetchall():
            if row[8]:
                claimed.parked.append((row[3], row[0]))
            else:
                claimed.jobs.append(ClaimedJob(*row[:8]))
        return claimed

    async def promote_due(
        self, conn: AsyncConn, queues: Sequence[str], limit: int
    ) -> tuple[int, float | None]:
        """Due scheduled jobs of `queues` made queued, at most `limit`; and in how many seconds
        the next one falls due (None: none is scheduled; infinite for infinity)."""
        cur = await conn.execute(
            query("job_promote_due", self.schema),
            {"queues": list(queues), "limit": limit, "now": None},
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), None if row[1] is None else float(row[1])

    async def finish_many(
        self, conn: AsyncConn, outcomes: Sequence[OutcomeRow], keep_history: bool
    ) -> Finished:
        """Write outcomes: finished jobs move to history, retried ones back to the queue."""
        params = finish_params(outcomes, keep_history)
        cur = await conn.execute(statement("job_finish_many", self.schema), params)
        row = await cur.fetchone()
        assert row is not None
        return Finished(int(row[0]), int(row[1]), int(row[2]))

    async def release_many(self, conn: AsyncConn, ids: Sequence[int], worker_id: int) -> None:
        """Put a stopping worker's unfinished jobs back without spending an attempt."""
        await conn.execute(
            query("job_release_many", self.schema), {"ids": list(ids), "worker_id": worker_id}
        )

    async def release_orphans(
        self, conn: AsyncConn, worker_id: int, known: Sequence[int]
    ) -> list[int]:
        """Put back this worker's running jobs it does not know of (a claim whose reply a
        broken connection lost); returns their ids."""
        cur = await conn.execute(
            query("job_release_orphans", self.schema),
            {"worker_id": worker_id, "known": list(known)},
        )
        return [int(row[0]) for row in await cur.fetchall()]

    async def cancel_requested(
        self, conn: AsyncConn, ids: Sequence[int], worker_id: int
    ) -> list[int]:
        """Those of this worker's running jobs `ids` whose cancellation was requested."""
        cur = await conn.execute(
            query("job_list_cancel_requested", self.schema),
            {"worker_id": worker_id, "ids": list(ids)},
        )
        return [int(row[0]) for row in await cur.fetchall()]

    async def find_stranded(
        self, conn: AsyncConn, lease: timedelta, limit: int
    ) -> list[ClaimedJob]:
        """Running jobs of workers silent for longer than `lease`, locked for the caller's
        transaction."""
        cur = await conn.execute(
            query("job_find_stranded", self.schema),
            {"lease": lease.total_seconds(), "limit": limit, "now": None},
        )
        return [ClaimedJob(*row) for row in await cur.fetchall()]

    async def find_orphaned(self, conn: AsyncConn, limit: int) -> list[ClaimedJob]:
        """Running jobs whose worker row is gone, locked for the caller's transaction."""
        cur = await conn.execute(query("job_find_orphaned", self.schema), {"limit": limit})
        return [ClaimedJob(*row) for row in await cur.fetchall()]

    async def fail_out_of_range(
        self, conn: AsyncConn, queues: Sequence[str], limit: int, keep_history: bool
    ) -> int:
        """Fail scheduled jobs of `queues` whose run_at is after year 9999; returns how many."""
        cur = await conn.execute(
            query("job_fail_out_of_range", self.schema),
            {"queues": list(queues), "limit": limit, "keep_history": keep_history, "now": None},
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0
