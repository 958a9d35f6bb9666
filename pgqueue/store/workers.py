"""The workers table: one row per live worker, kept fresh by its heartbeat."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row

from pgqueue.queries import query


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
