"""The workers table and the worker's sessions: one row per live worker, kept fresh by its
heartbeat, and the server session each records, which rescuers look for; the rescuer's
lock and notices, which are about dead workers; and the settings and subscription of the
worker's own connections. Runs sql/queries/workers.sql."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row

from pgqueue.codec import encode_json
from pgqueue.queries import dead_channel, query
from pgqueue.store.plan import AsyncConn, Plan, SyncConn, execute, fetch, fetch_one


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
    # Its own tally as of its last beat: {"outcomes": {status: count}, "claim_ms_p50"}.
    stats: dict[str, object] | None = None


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """What a worker says of itself in its row (worker_register, and a revived heartbeat)."""

    name: str
    hostname: str
    pid: int
    queues: Sequence[str]
    concurrency: int

    def as_params(self) -> dict[str, object]:
        """The statements' named parameters."""
        return {
            "name": self.name,
            "hostname": self.hostname,
            "pid": self.pid,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
        }


@dataclass(frozen=True, slots=True)
class BeatParams:
    """One heartbeat's parameters: who beats, its tally as JSON, and the backend pid the
    server named when the beat's connection opened (None: record no session)."""

    identity: WorkerIdentity
    worker_id: int
    stats: str | None = None
    client_pid: int | None = None

    def as_params(self) -> dict[str, object]:
        """The statement's named parameters."""
        return self.identity.as_params() | {
            "worker_id": self.worker_id,
            "stats": self.stats,
            "client_pid": self.client_pid,
        }


@dataclass(frozen=True)
class Registered:
    """worker_register's row."""

    id: int


@dataclass(frozen=True)
class Beat:
    """worker_heartbeat's row: whether the worker's row had been removed and was put back,
    and whether the beat's session was recorded (it is the worker's own)."""

    revived: bool
    recorded: bool


@dataclass(frozen=True)
class Locked:
    """A try-lock's row (worker_rescue_lock): whether the lock was taken."""

    locked: bool


@dataclass(frozen=True)
class Transactions:
    """worker_transactions_in_progress's and worker_transactions_still_in_progress's row."""

    xids: list[int]


@dataclass(frozen=True)
class GoneSession:
    """A worker whose recorded session the server no longer had when seen
    (worker_sessions_gone)."""

    worker_id: int
    session_pid: int  # the recorded session: its backend's pid ...
    session_start: datetime  # ... and that backend's start, which tell it from a reused pid
    seen_at: datetime  # by the database's clock


@dataclass(frozen=True)
class Gone:
    """worker_delete_gone's row: a worker declared dead."""

    id: int


def bound_idle(schema: str, ms: int) -> Plan[None]:
    """Have the server end this session if its open transaction idles longer than `ms`: a
    worker that hangs mid-transaction must not hold its row locks for longer."""
    yield query("transaction_bound_idle", schema), {"ms": str(ms)}


class WorkersStore:
    def __init__(self, schema: str) -> None:
        self.schema = schema

    def list(
        self, conn: SyncConn, limit: int = 1000, now: datetime | None = None
    ) -> list[WorkerRow]:
        """The workers with a row, newest first."""
        with conn.cursor(row_factory=class_row(WorkerRow)) as cur:
            cur.execute(query("worker_list", self.schema), {"limit": limit, "now": now})
            return cur.fetchall()

    async def register(
        self, conn: AsyncConn, identity: WorkerIdentity, *, session: bool = False
    ) -> int:
        """A starting worker's row; its id guards every write it makes to a job. With
        `session`, the row records the session of `conn` if it is the worker's own."""
        statement = query("worker_register", self.schema)
        client_pid = conn.info.backend_pid if session else None
        params = identity.as_params() | {"client_pid": client_pid}
        row = await fetch_one(conn, Registered, statement, params)
        return row.id

    def heartbeat(self, conn: SyncConn, beat: BeatParams) -> Beat:
        """Prove the worker alive (the heartbeat runs in a thread, on a sync connection), and
        record the session `conn` runs on when `beat.client_pid` names it. `revived` when its
        row had been removed as dead and was put back: its jobs were rescued."""
        with conn.cursor(row_factory=class_row(Beat)) as cur:
            statement = query("worker_heartbeat", self.schema)
            row = cur.execute(statement, beat.as_params()).fetchone()
        assert row is not None  # an upsert's RETURNING always has its row
        return row

    async def sessions_gone(self, conn: AsyncConn, worker_id: int) -> Sequence[GoneSession]:
        """Workers other than `worker_id` whose recorded session the server no longer has,
        among those it can tell (see workers.sql)."""
        async with conn.cursor(row_factory=class_row(GoneSession)) as cur:
            await cur.execute(query("worker_sessions_gone", self.schema), {"worker_id": worker_id})
            return await cur.fetchall()

    async def delete_gone(self, conn: AsyncConn, gone: Sequence[GoneSession]) -> Sequence[int]:
        """Remove the workers whose recorded session is still the one they were seen gone
        with; returns their ids. Their rows stay locked until the caller's transaction ends."""
        rows = await fetch(
            conn,
            Gone,
            query("worker_delete_gone", self.schema),
            {
                "ids": [g.worker_id for g in gone],
                "pids": [g.session_pid for g in gone],
                "starts": [g.session_start for g in gone],
            },
        )
        return [row.id for row in rows]

    async def deregister(self, conn: AsyncConn, worker_id: int) -> None:
        await execute(conn, query("worker_deregister", self.schema), {"worker_id": worker_id})

    async def claim_session(self, conn: AsyncConn) -> None:
        """Commits on this session return before their WAL is flushed (see workers.sql)."""
        await execute(conn, query("session_set_async_commit", self.schema))

    async def generic_plans_session(self, conn: AsyncConn) -> None:
        """This session's prepared statements run on their generic plans (see workers.sql)."""
        await execute(conn, query("session_generic_plans", self.schema))

    async def planner_session(self, conn: AsyncConn) -> None:
        """This session's planner keeps to index access (see workers.sql)."""
        await execute(conn, query("session_prefer_indexes", self.schema))

    async def listen(self, conn: AsyncConn) -> None:
        """Subscribe `conn` to the schema's wake-up channel."""
        await execute(conn, query("worker_listen", self.schema))

    async def rescue_lock(self, conn: AsyncConn) -> bool:
        """Take the schema's rescue lock for the caller's transaction, if no one holds it."""
        row = await fetch_one(
            conn, Locked, query("worker_rescue_lock", self.schema), {"schema": self.schema}
        )
        return row.locked

    async def delete_dead(self, conn: AsyncConn, lease: timedelta) -> None:
        """Remove workers silent for longer than the lease once none of their jobs runs."""
        await execute(
            conn,
            query("worker_delete_dead", self.schema),
            {"lease": lease.total_seconds(), "now": None},
        )

    async def prune_removed(self, conn: AsyncConn, lease: timedelta) -> None:
        """Forget the removed workers that came back, and those long gone with no job left."""
        await execute(
            conn,
            query("worker_removed_prune", self.schema),
            {"lease": lease.total_seconds(), "now": None},
        )

    async def notify_dead_job(self, conn: AsyncConn, job: Mapping[str, object]) -> None:
        """Tell the dead-job channel's listeners, at commit, that a job was abandoned."""
        await execute(
            conn,
            query("worker_notify_dead_job", self.schema),
            {"channel": dead_channel(self.schema), "payload": encode_json(job)},
        )

    async def skip_wakes(
        self, conn: AsyncConn, worker_id: int, ranges: Mapping[str, tuple[int, int, bool]]
    ) -> None:
        """Say which wake-ups the worker does not need, per queue: those for jobs with a
        priority in the range (sql/migrations/0015_quiet_wake.sql), of new jobs only when
        the flag is set (0035_steady_wake.sql)."""
        await execute(
            conn,
            query("worker_wake_range", self.schema),
            {
                "worker_id": worker_id,
                "queues": list(ranges),
                "below": [low for low, _, _ in ranges.values()],
                "above": [high for _, high, _ in ranges.values()],
                "new_only": [new_only for _, _, new_only in ranges.values()],
            },
        )

    async def in_progress(self, conn: AsyncConn) -> Sequence[int]:
        """The transactions in progress now."""
        statement = query("worker_transactions_in_progress", self.schema)
        return (await fetch_one(conn, Transactions, statement)).xids

    async def still_in_progress(self, conn: AsyncConn, xids: Sequence[int]) -> Sequence[int]:
        """Which of the transactions `xids` have not ended yet."""
        statement = query("worker_transactions_still_in_progress", self.schema)
        return (await fetch_one(conn, Transactions, statement, {"xids": xids})).xids
