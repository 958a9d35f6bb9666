"""pgqueue's statements on a Citus cluster: the layout, and the jobs statements that name one
shard each. Runs sql/queries/citus.sql.

Every statement on a job names its shard, so Citus routes it to the shard's node as one task;
the backlog read (`backlog`) and the search for stranded jobs are the only ones that cross
shards. None sends a NOTIFY (a two-phase commit refuses them). The statements a worker runs
per job take `tables`: empty through the coordinator, where they name one shard key; on a
node, a ShardTables' own tables, every row in them (`citus_shard_tables`, `node_backlog`).
An enqueue with a dedupe key and a window also takes a savepoint, which names no table.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import psycopg
from psycopg import sql
from psycopg.rows import args_row

from pgqueue.codec import encode_json
from pgqueue.errors import DatabaseError
from pgqueue.models import ClaimedJob, Enqueued
from pgqueue.queries import IN_ALL_ROWS, Tables, query, statement
from pgqueue.store.jobs import DEDUPE_ROUNDS
from pgqueue.store.plan import AsyncConn, Plan, SyncConn, rows_as


@dataclass(frozen=True)
class Backlog:
    """citus_shard_backlog's row: one shard value's queued and due jobs, and in how many
    seconds its next scheduled job falls due (None: none scheduled)."""

    shard: str
    queued: int
    due: int
    next_due_in: float | None


@dataclass(frozen=True)
class Stranded:
    """citus_job_find_stranded's row: a running job whose worker is gone."""

    shard: str
    id: int
    worker_id: int
    attempt: int
    max_attempts: int


@dataclass(frozen=True)
class ShardTables:
    """citus_shard_tables' row: one shard of jobs, the history shard beside it, the copy of
    queue_pauses there, and the node that holds them."""

    jobs: int
    history: int
    pauses: int
    host: str
    port: int

    @property
    def key(self) -> str:
        """The shard as a worker on the nodes names it (its backlog rows, its jobs)."""
        return str(self.jobs)

    @property
    def tables(self) -> Tables:
        """The shard's own tables, and all their rows, as its node's statements name them."""
        return (
            ("jobs", f"jobs_{self.jobs}"),
            ("job_history", f"job_history_{self.history}"),
            ("queue_pauses", f"queue_pauses_{self.pauses}"),
            *IN_ALL_ROWS,
        )


@dataclass(frozen=True)
class Version:
    """citus_version's row."""

    extversion: str


@dataclass(frozen=True)
class LaidOut:
    """citus_laid_out's row."""

    laid_out: bool


@dataclass(frozen=True)
class JobId:
    """The id a statement returns for each job it wrote."""

    id: int


@dataclass(frozen=True)
class Paused:
    """citus_queue_pause's row: a queue, and whether this pause is new."""

    queue: str
    new: bool


@dataclass(frozen=True)
class Queue:
    """citus_queue_resume's row."""

    queue: str


def version(conn: SyncConn) -> str | None:
    """The citus extension's version in the connected database; None without it."""
    with conn.cursor(row_factory=args_row(Version)) as cur:
        row = cur.execute(query("citus_version", "pgqueue")).fetchone()
    return None if row is None else row.extversion


def laid_out(conn: SyncConn, schema: str) -> bool:
    """Whether `schema`'s jobs are distributed (requires the citus extension)."""
    with conn.cursor(row_factory=args_row(LaidOut)) as cur:
        row = cur.execute(query("citus_laid_out", schema)).fetchone()
    return row is not None and row.laid_out


async def laid_out_async(conn: AsyncConn, schema: str) -> bool:
    async with conn.cursor(row_factory=args_row(LaidOut)) as cur:
        await cur.execute(query("citus_laid_out", schema))
        row = await cur.fetchone()
    return row is not None and row.laid_out


def layout_sql(schema: str) -> str:
    """The layout's SQL for `schema`, as text to review (`migrate --citus --sql`)."""
    return query("citus_lay_out", schema).as_string(None).strip()


def lay_out(conn: SyncConn, schema: str) -> None:
    """Distribute the migrated `schema`, in the caller's transaction."""
    conn.execute(query("citus_lay_out", schema))


def enqueue(conn: SyncConn, schema: str, rows: Sequence[Mapping[str, object]]) -> list[Enqueued]:
    """Store jobs (citus_job_insert's parameters each, with `dedupe_window` in seconds) in
    the caller's transaction, or in one of their own on an autocommit connection; their ids,
    in order. Jobs without a dedupe key are inserted first, in order. A job with a key
    resolves to the live job with that key on its shard, or to one that finished within its
    window, else it is inserted; the same shard and key twice in `rows` is one job. Keys are
    resolved in (shard, key) order, so two batches never wait on each other in a cycle."""
    out: list[Enqueued | None] = [None] * len(rows)
    plain = [i for i, row in enumerate(rows) if row["dedupe_key"] is None]
    keyed: dict[tuple[str, str], list[int]] = {}
    for i, row in enumerate(rows):
        if row["dedupe_key"] is not None:
            keyed.setdefault((str(row["shard"]), str(row["dedupe_key"])), []).append(i)
    own = conn.transaction() if conn.autocommit else contextlib.nullcontext()
    with own, conn.cursor(row_factory=args_row(JobId)) as cur:
        for i in plain:
            job_id = _try_insert(cur, schema, rows[i])
            assert job_id is not None  # a job without a dedupe key meets no conflict
            out[i] = Enqueued(job_id)
        for key in sorted(keyed):
            first, *again = keyed[key]
            out[first] = found = _insert_unique(cur, schema, rows[first])
            for i in again:
                out[i] = Enqueued(found, created=False)
    return [job_id for job_id in out if job_id is not None]


def _insert_unique(cur: psycopg.Cursor[JobId], schema: str, row: Mapping[str, object]) -> Enqueued:
    """The job a dedupe key resolves to on its shard (citus_job_find_dedupe), else `row`
    inserted. Each round reads with a newer snapshot, so the next round finds a concurrent
    enqueue of the key that committed first."""
    params = {**row, "now": None}
    for _ in range(DEDUPE_ROUNDS):
        found = cur.execute(statement("citus_job_find_dedupe", schema), params).fetchone()
        if found is not None:
            return Enqueued(found.id, created=False)
        inserted = _try_insert(cur, schema, params)
        if inserted is not None:
            return Enqueued(inserted)
    raise DatabaseError(
        f"dedupe key {row['dedupe_key']!r} on shard {row['shard']!r} did not settle after "
        f"{DEDUPE_ROUNDS} rounds of concurrent enqueues: retry the transaction"
    )


def _try_insert(
    cur: psycopg.Cursor[JobId], schema: str, params: Mapping[str, object]
) -> int | None:
    """citus_job_insert's id; None when a job with the key committed first or, given a window,
    when one finished unseen since the find (the insert is then undone to its savepoint)."""
    if params["dedupe_window"] is None:
        row = cur.execute(statement("citus_job_insert", schema), params).fetchone()
        return None if row is None else row.id
    cur.execute(query("citus_dedupe_savepoint", schema))
    row = cur.execute(statement("citus_job_insert", schema), params).fetchone()
    lost = row is not None and _finished_meanwhile(cur, schema, params)
    if lost:
        cur.execute(query("citus_dedupe_rollback", schema))
    cur.execute(query("citus_dedupe_release", schema))
    return None if row is None or lost else row.id


def _finished_meanwhile(
    cur: psycopg.Cursor[JobId], schema: str, params: Mapping[str, object]
) -> bool:
    cur.execute(statement("citus_job_dedupe_recheck", schema), params)
    return cur.fetchone() is not None


def dedupe_statements(schema: str) -> dict[str, sql.Composed]:
    """The statements an enqueue with a dedupe key sends, by name (tests read their plans)."""
    names = ("citus_job_find_dedupe", "citus_job_insert", "citus_job_dedupe_recheck")
    return {name: query(name, schema) for name in names}


async def backlog(conn: AsyncConn, schema: str, queues: Sequence[str]) -> list[Backlog]:
    async with conn.cursor(row_factory=args_row(Backlog)) as cur:
        await cur.execute(statement("citus_shard_backlog", schema), {"queues": list(queues)})
        return await cur.fetchall()


async def shard_tables(conn: AsyncConn, schema: str) -> list[ShardTables]:
    """Every shard of `schema`'s jobs and where it lives (read on the coordinator)."""
    async with conn.cursor(row_factory=args_row(ShardTables)) as cur:
        await cur.execute(statement("citus_shard_tables", schema), {})  # {}: %% is one %
        return await cur.fetchall()


async def node_backlog(
    conn: AsyncConn, schema: str, shards: Sequence[ShardTables], queues: Sequence[str], cap: int
) -> list[Backlog]:
    """On one node, in one statement: each of its `shards`' backlog (citus_node_backlog),
    each row named by the shard's key."""
    async with conn.cursor(row_factory=args_row(Backlog)) as cur:
        params = {"queues": list(queues), "cap": cap}
        await cur.execute(node_backlog_statement(schema, shards), params)
        return await cur.fetchall()


def node_backlog_statement(schema: str, shards: Sequence[ShardTables]) -> sql.Composed:
    """node_backlog's statement as sent (tests read its plan)."""
    parts = [
        sql.SQL("SELECT {} AS shard, b.* FROM ({}) AS b").format(
            sql.Literal(shard.key), query("citus_node_backlog", schema, shard.tables)
        )
        for shard in shards
    ]
    return sql.SQL(" UNION ALL ").join(parts)


async def promote(
    conn: AsyncConn,
    schema: str,
    shard: str,
    queues: Sequence[str],
    limit: int,
    tables: Tables = (),
) -> int:
    params = {"shard": shard, "queues": list(queues), "limit": limit}
    cur = await conn.execute(statement("citus_job_promote", schema, tables), params)
    return len(await cur.fetchall())


async def claim(
    conn: AsyncConn,
    schema: str,
    shard: str,
    queues: Sequence[str],
    limit: int,
    worker_id: int,
    tables: Tables = (),
) -> list[ClaimedJob]:
    params = {"shard": shard, "queues": list(queues), "limit": limit, "worker_id": worker_id}
    async with conn.cursor(row_factory=args_row(ClaimedJob)) as cur:
        await cur.execute(statement(_claim_name(tables), schema, tables), params)
        return sorted(await cur.fetchall(), key=lambda j: (j.priority, j.id))


def claim_statement(schema: str, tables: Tables = ()) -> sql.Composed:
    """The claim as sent (tests read its plan): of one shard key through the coordinator,
    of a shard table on its node."""
    return query(_claim_name(tables), schema, tables)


def _claim_name(tables: Tables) -> str:
    return "citus_node_claim" if tables else "citus_job_claim"


async def finish(
    conn: AsyncConn,
    schema: str,
    shard: str,
    final: Sequence[Mapping[str, object]],
    retried: Sequence[Mapping[str, object]],
    keep_history: bool,
    tables: Tables = (),
) -> int:
    """Write one shard's outcomes (Outcome.as_row dicts) in one transaction on its node:
    final ones leave the hot table (to history unless `keep_history` is off), retried ones
    go back. How many rows moved."""
    async with conn.transaction():
        return await write_outcomes(conn, schema, shard, final, retried, keep_history, tables)


async def write_outcomes(
    conn: AsyncConn,
    schema: str,
    shard: str,
    final: Sequence[Mapping[str, object]],
    retried: Sequence[Mapping[str, object]],
    keep_history: bool,
    tables: Tables = (),
) -> int:
    """`finish` in the caller's transaction, which may write other shards of the node."""
    moved = 0
    if final:
        name = "citus_job_finish" if keep_history else "citus_job_drop"
        params = _outcomes(shard, final, keep_history)
        cur = await conn.execute(statement(name, schema, tables), params)
        moved += len(await cur.fetchall())
    if retried:
        rows = [_retry(row) for row in retried]
        cur = await conn.execute(
            statement("citus_job_retry", schema, tables), _outcomes(shard, rows, keep_history)
        )
        moved += len(await cur.fetchall())
    return moved


def _retry(row: Mapping[str, object]) -> dict[str, object]:
    """A retry's outcome with what citus_job_retry writes worked out."""
    delay = row.get("retry_in")
    retry_in = max(float(delay), 0.0) if isinstance(delay, int | float) else 0.0
    snooze = bool(row.get("snooze"))
    error = row.get("error")
    return {
        **row,
        "next": "scheduled" if retry_in > 0 else "queued",
        "retry_in": retry_in,
        "given_back": 1 if snooze else 0,
        "append": [] if error is None or snooze else [error],
    }


def _outcomes(
    shard: str, rows: Sequence[Mapping[str, object]], keep_history: bool
) -> dict[str, object]:
    return {
        "shard": shard,
        "ids": [row["id"] for row in rows],
        "outcomes": "{" + ",".join(f'"{row["id"]}":{encode_json(row)}' for row in rows) + "}",
        "keep_history": keep_history,
    }


async def release(
    conn: AsyncConn,
    schema: str,
    shard: str,
    ids: Sequence[int],
    worker_id: int,
    tables: Tables = (),
) -> int:
    params = {"shard": shard, "ids": list(ids), "worker_id": worker_id}
    cur = await conn.execute(statement("citus_job_release", schema, tables), params)
    return len(await cur.fetchall())


async def release_orphans(
    conn: AsyncConn, schema: str, worker_id: int, known: Sequence[int]
) -> int:
    """Put back this worker's running jobs not in `known`; how many."""
    params = {"worker_id": worker_id, "known": list(known)}
    cur = await conn.execute(statement("citus_job_release_orphans", schema), params)
    return len(await cur.fetchall())


async def stranded(conn: AsyncConn, schema: str, lease: float, limit: int) -> list[Stranded]:
    async with conn.cursor(row_factory=args_row(Stranded)) as cur:
        await cur.execute(
            statement("citus_job_find_stranded", schema), {"lease": lease, "limit": limit}
        )
        return await cur.fetchall()


async def rescue(conn: AsyncConn, schema: str, job: Stranded) -> bool:
    """Put `job` back on its shard, its attempt spent; whether it was still stranded."""
    error = _lost(job, "its worker stopped heartbeating while it ran")
    params = {
        "shard": job.shard,
        "id": job.id,
        "worker_id": job.worker_id,
        "attempt": job.attempt,
        "errors": encode_json([error]),
    }
    cur = await conn.execute(statement("citus_job_rescue", schema), params)
    return bool(await cur.fetchall())


def lost_outcome(job: Stranded) -> dict[str, object]:
    """The failure a stranded job whose attempts are spent is finished with."""
    error = _lost(job, "its worker stopped heartbeating while it ran, on its last attempt")
    row: dict[str, object] = json.loads(
        encode_json(
            {
                "id": job.id,
                "attempt": job.attempt,
                "worker_id": job.worker_id,
                "status": "failed",
                "error": error,
                "duration": None,
            }
        )
    )
    return row


def pause_plan(schema: str, queues: Sequence[str], reason: str) -> Plan[list[str]]:
    """Pause `queues`; those that were running."""
    rows = yield query("citus_queue_pause", schema), {"queues": list(queues), "reason": reason}
    return sorted(row.queue for row in rows_as(Paused, rows) if row.new)


def resume_plan(schema: str, queues: Sequence[str]) -> Plan[list[str]]:
    """Resume `queues`; those that were paused."""
    rows = yield query("citus_queue_resume", schema), {"queues": list(queues)}
    return sorted(row.queue for row in rows_as(Queue, rows))


def _lost(job: Stranded, why: str) -> dict[str, object]:
    at = datetime.now(timezone.utc).isoformat()
    return {"attempt": job.attempt, "at": at, "kind": "lost", "error": why, "traceback": ""}
