"""The workers table: one row per live worker, kept fresh by its heartbeat; and the
rescuer's lock and notices, which are about dead workers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row

from pgqueue.queries import dead_channel, query
from pgqueue.registry import encode_json

AsyncConn = psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class WorkerRow:
    """A worker as `pgqueue workers` shows it."""

    id: int
    name: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    silent_for: timedelta  # since its last heartbeat, by the database's clock
    running: int


class WorkersStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    def list(
        self, conn: psycopg.Connection[Any], limit: int = 1000, now: datetime | None = None
    ) -> list[WorkerRow]:
        """The workers with a row, newest first."""
        with conn.cursor(row_factory=class_row(WorkerRow)) as cur:
            cur.execute(query("worker_list", self.schema), {"limit": limit, "now": now})
            return cur.fetchall()

    async def register(self, conn: AsyncConn, identity: dict[str, Any]) -> int:
        """A starting worker's row; its id guards every write it makes to a job."""
        cur = await conn.execute(query("worker_register", self.schema), identity)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def deregister(self, conn: AsyncConn, worker_id: int) -> None:
        await conn.execute(query("worker_deregister", self.schema), {"worker_id": worker_id})

    async def migrated(self, conn: AsyncConn) -> bool:
        """Whether the schema has pgqueue's tables at all."""
        cur = await conn.execute(
            query("migration_table_exists", self.schema), {"schema": self.schema}
        )
        row = await cur.fetchone()
        return bool(row and row[0])

    async def rescue_lock(self, conn: AsyncConn) -> bool:
        """Take the schema's rescue lock for the caller's transaction, if no one holds it."""
        cur = await conn.execute(query("worker_rescue_lock", self.schema), {"schema": self.schema})
        row = await cur.fetchone()
        return bool(row and row[0])

    async def delete_dead(self, conn: AsyncConn, lease: timedelta) -> None:
        """Remove workers silent for longer than the lease once none of their jobs runs."""
        await conn.execute(
            query("worker_delete_dead", self.schema),
            {"lease": lease.total_seconds(), "now": None},
        )

    async def notify_dead_job(self, conn: AsyncConn, job: dict[str, Any]) -> None:
        """Tell the dead-job channel's listeners, at commit, that a job was abandoned."""
        await conn.execute(
            query("job_notify_dead", self.schema),
            {"channel": dead_channel(self.schema), "payload": encode_json(job)},
        )
