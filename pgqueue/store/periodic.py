"""The recurring jobs' tables: `periodic` (one row per definition) and `periodic_ticks` (one
row per tick that became a job). Runs sql/queries/periodic.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import class_row

from pgqueue.codec import encode_json
from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, SyncConn, execute


@dataclass(frozen=True)
class Definition:
    """A definition as a scheduler pass sees it, with the latest tick already dealt with."""

    name: str
    definition: dict[str, object]
    last_tick: datetime
    now: datetime  # the database's time of the pass, or the pinned one


@dataclass(frozen=True)
class Tick:
    name: str
    tick: datetime


@dataclass(frozen=True)
class TickJob:
    """The job a claimed tick became."""

    name: str
    tick: datetime
    job_id: int


@dataclass(frozen=True)
class StoredPeriodic:
    """A recurring job as workers last stored it, and the latest tick that became a job."""

    name: str
    definition: dict[str, object]
    last_tick: datetime  # dealt with up to here, enqueued or skipped
    updated_at: datetime  # each scheduler pass over it stores it again
    last_enqueued_tick: datetime | None
    last_job_id: int | None
    checked_at: datetime  # the database's time of the read


def list_periodic(conn: SyncConn, schema: str, now: datetime | None = None) -> list[StoredPeriodic]:
    """Every stored definition, by name. `now` pins checked_at for tests."""
    with conn.cursor(row_factory=class_row(StoredPeriodic)) as cur:
        return cur.execute(query("periodic_list", schema), {"now": now}).fetchall()


class PeriodicStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def ensure(
        self,
        conn: AsyncConn,
        definitions: Sequence[tuple[str, dict[str, object]]],
        now: datetime | None,
    ) -> None:
        """Record definitions no worker has seen yet, as dealt with up to now."""
        rows = [{"name": name, "definition": data} for name, data in definitions]
        await execute(
            conn,
            query("periodic_state_ensure", self.schema),
            {"periodics": encode_json(rows), "now": now},
        )

    async def lock(
        self, conn: AsyncConn, names: Sequence[str], now: datetime | None
    ) -> list[Definition]:
        """Lock the named definitions until the caller's transaction ends, in name order."""
        async with conn.cursor(row_factory=class_row(Definition)) as cur:
            await cur.execute(
                query("periodic_state_lock", self.schema), {"names": list(names), "now": now}
            )
            return await cur.fetchall()

    async def claim_ticks(
        self,
        conn: AsyncConn,
        ticks: Sequence[Tick],
        worker_id: int,
        now: datetime | None,
    ) -> list[Tick]:
        """The ticks of `ticks` no one claimed before, now claimed by `worker_id`."""
        if not ticks:
            return []
        rows = [{"name": t.name, "tick": t.tick.isoformat()} for t in ticks]
        async with conn.cursor(row_factory=class_row(Tick)) as cur:
            await cur.execute(
                query("periodic_tick_claim", self.schema),
                {"ticks": encode_json(rows), "worker_id": worker_id, "now": now},
            )
            return await cur.fetchall()

    async def link_ticks(self, conn: AsyncConn, links: Sequence[TickJob]) -> None:
        """Record the job each claimed tick became."""
        rows = [{"name": t.name, "tick": t.tick.isoformat(), "job_id": t.job_id} for t in links]
        await execute(conn, query("periodic_tick_link", self.schema), {"links": encode_json(rows)})

    async def advance(
        self,
        conn: AsyncConn,
        states: Sequence[tuple[str, dict[str, object], datetime]],
        now: datetime | None,
    ) -> None:
        """Store each definition and the latest tick dealt with; a tick never moves back."""
        rows = [
            {"name": name, "definition": data, "last_tick": tick.isoformat()}
            for name, data, tick in states
        ]
        await execute(
            conn,
            query("periodic_state_advance", self.schema),
            {"states": encode_json(rows), "now": now},
        )
