"""The raw SQL bound: what PostgreSQL itself does on pgqueue's jobs table, with no Python.

Owns: running the pgbench custom scripts in bench/throughput/pgbench/ against the bench
schema's `jobs` table (same columns, indexes and claim predicate as pgqueue's), and one COPY
measured from psycopg with the rows rendered before the clock starts. Figures are rows per second.
More bounds say where a gap to the raw bound comes from: lease_finish.sql is pgqueue's own
job lifecycle in SQL alone (what the design costs the server); psycopg_lifecycle runs the
same two statements from Python, reading each leased job and calling a no-op coroutine for
it (what any Python worker pays before its own logic); and psycopg_insert sends the raw
single-row INSERT from Python, in the client shapes pgqueue's enqueue runs in (what Python
and psycopg cost before pgqueue does anything).
pgbench is found on PATH or at /usr/bin/pgbench; if it is missing, RuntimeError says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.throughput.systems import SCHEMA

SCRIPTS = Path(__file__).resolve().parent / "pgbench"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


def pgbench_path() -> str:
    found = shutil.which("pgbench") or (
        "/usr/bin/pgbench" if Path("/usr/bin/pgbench").exists() else None
    )
    if found is None:
        raise RuntimeError(
            "pgbench is needed for the raw SQL bound: apt-get install postgresql-client"
        )
    return found


def pgbench(dsn: str, script: str, *, clients: int, transactions: int, **variables: int) -> float:
    """Transactions per second of `script` (a file in bench/throughput/pgbench/), prepared
    statements."""
    command = [
        pgbench_path(), "-n", "-M", "prepared",
        "-c", str(clients), "-j", str(min(clients, 2)), "-t", str(transactions),
        "-f", str(SCRIPTS / script),
    ]  # fmt: skip
    for name, value in variables.items():
        command += ["-D", f"{name}={value}"]
    env = os.environ | {"PGOPTIONS": f"-c search_path={SCHEMA}"}
    done = subprocess.run(
        [*command, dsn], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    match = _TPS.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench {script} failed: {done.stderr.strip() or done.stdout[-500:]}")
    return float(match[1])


def fill(dsn: str, jobs: int) -> None:
    """An empty jobs table, then `jobs` queued no-op jobs, vacuumed and analysed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.jobs")
        conn.execute(
            f"INSERT INTO {SCHEMA}.jobs (queue, task, args)"
            " SELECT 'default', 'noop', jsonb_build_object('seq', n)"
            " FROM generate_series(1, %s) AS n",
            [jobs],
        )
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")


def claim_delete(dsn: str, jobs: int, batch: int, clients: int) -> dict[str, Any]:
    fill(dsn, jobs)
    per_client = max(1, jobs // (batch * clients))
    tps = pgbench(dsn, "claim_delete.sql", clients=clients, transactions=per_client, batch=batch)
    return {"jobs": per_client * clients * batch, "jobs_per_s": tps * batch}


def lease_finish(dsn: str, jobs: int, batch: int, clients: int) -> dict[str, Any]:
    """pgqueue's lifecycle in SQL alone: claim `batch` as leases, then finish them into
    history (bench/throughput/pgbench/lease_finish.sql)."""
    fill(dsn, jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.job_history")
    per_client = max(1, jobs // (batch * clients))
    tps = pgbench(dsn, "lease_finish.sql", clients=clients, transactions=per_client, batch=batch)
    return {"jobs": per_client * clients * batch, "jobs_per_s": tps * batch}


# lease_finish.sql's two statements as a Python worker must send them: the lease returns
# what it takes to run each job, and the finish names the jobs run (with two connections a
# lease can be taken before the previous batch is finished).
LEASE = f"""
UPDATE {SCHEMA}.jobs AS j
SET status = 'running', attempt = j.attempt + 1, started_at = now(), worker_id = %(worker)s
WHERE j.id = ANY(ARRAY(
    SELECT id FROM {SCHEMA}.jobs
    WHERE queue = 'default' AND status = 'queued' AND NOT atomic
    ORDER BY priority, id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED))
RETURNING j.id, j.task, j.args"""
FINISH = f"""
WITH finished AS (
    DELETE FROM {SCHEMA}.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.worker_id = %(worker)s AND j.status = 'running'
    RETURNING j.id, j.queue, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.run_at,
              j.created_at, j.started_at, j.worker_id, j.errors, j.dedupe_key, j.retry_of,
              j.atomic, j.concurrency_key
)
INSERT INTO {SCHEMA}.job_history
    (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
     started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
     concurrency_key)
SELECT id, queue, task, args, 'succeeded', priority, attempt, max_attempts, run_at, created_at,
       started_at, now(), worker_id, errors, NULL, dedupe_key, retry_of, atomic, concurrency_key
FROM finished"""


SHAPES = {
    "one": "one connection",
    "two": "two connections, each leasing and finishing",
    "apart": "two connections, leases on one, finishes on the other",
}


def lifecycle_psycopg(dsn: str, jobs: int, batch: int, shape: str) -> dict[str, Any]:
    """lease_finish.sql from one asyncio process: lease `batch` jobs, call a no-op coroutine
    for each with its decoded arguments, finish them into history. Shapes (SHAPES): `one`, one
    connection, each batch finished before the next lease; `two`, two such loops, as pgbench's
    two clients run; `apart`, leases go on while a second connection finishes everything run
    since its last finish in one statement, as pgqueue's worker does. The least any Python
    worker does for these statements: no registry, no concurrency limit, no outcomes, no
    error handling."""
    if shape not in SHAPES:
        raise ValueError(f"psycopg_lifecycle: shape {shape!r} is not one of {', '.join(SHAPES)}")
    fill(dsn, jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.job_history")
    done, seconds = asyncio.run(_lifecycle(dsn, batch, shape))
    if done != jobs:
        raise RuntimeError(f"psycopg_lifecycle finished {done} of {jobs} jobs")
    return {"jobs": jobs, "jobs_per_s": jobs / seconds}


async def _noop(seq: int) -> None:
    return None


async def finish_apart(
    conn: psycopg.AsyncConnection[Any], ran: asyncio.Queue[list[int] | None], worker: int
) -> int:
    """Finish the ids `ran` hands over, everything run since the last finish in one
    statement, until it hands None; how many were finished. The `apart` shape's finisher, and
    the steady suite's bare worker's (bench/steady/bare.py)."""
    finished = 0
    last = False
    while not last and (ids := await ran.get()) is not None:
        while not ran.empty():
            more = ran.get_nowait()
            if more is None:
                last = True
                break
            ids += more
        await conn.execute(FINISH, {"ids": ids, "worker": worker})
        finished += len(ids)
    return finished


async def _lifecycle(dsn: str, batch: int, shape: str) -> tuple[int, float]:
    """Jobs finished, and the seconds from the first lease (connections open) to the last
    finish."""
    handlers = {"noop": _noop}
    worker = 7
    ran: asyncio.Queue[list[int] | None] = asyncio.Queue()
    finished = 0

    async def finish(conn: psycopg.AsyncConnection[Any], ids: list[int]) -> None:
        nonlocal finished
        await conn.execute(FINISH, {"ids": ids, "worker": worker})
        finished += len(ids)

    async def lease(conn: psycopg.AsyncConnection[Any], apart: bool) -> None:
        while True:
            cur = await conn.execute(LEASE, {"worker": worker, "batch": batch})
            rows = await cur.fetchall()
            if not rows:
                break
            for _, task, args in rows:
                await handlers[task](**args)
            ids = [row[0] for row in rows]
            if apart:
                ran.put_nowait(ids)
            else:
                await finish(conn, ids)
        if apart:
            ran.put_nowait(None)  # the finisher's last batch follows

    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as first,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as second,
    ):
        started = time.perf_counter()
        if shape == "one":
            await lease(first, apart=False)
        elif shape == "two":
            await asyncio.gather(lease(first, apart=False), lease(second, apart=False))
        else:
            _, finished = await asyncio.gather(
                lease(first, apart=True), finish_apart(second, ran, worker)
            )
        seconds = time.perf_counter() - started
    return finished, seconds


INSERT_ONE = f"INSERT INTO {SCHEMA}.jobs (queue, task, args) VALUES ('default', 'noop', %s::jsonb)"


class BareProducer:
    """INSERT_ONE (insert_one.sql's INSERT) from psycopg, one job per transaction, on its own
    connection: the producer of the steady suite's bounds."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def enqueue(self, seq: int) -> None:
        self.conn.execute(INSERT_ONE, [json.dumps({"seq": seq})])

    def close(self) -> None:
        self.conn.close()


def psycopg_insert(dsn: str, jobs: int, clients: int) -> dict[str, Any]:
    """insert_one.sql's INSERT from psycopg, one per transaction: on one sync connection
    (clients=1), or on `clients` async connections in one event loop, as
    PgQueue.enqueue_sequential and enqueue_concurrent run pgqueue's enqueue."""
    fill(dsn, 0)
    per_client = max(1, jobs // clients)
    started = time.perf_counter()
    if clients == 1:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for n in range(per_client):
                conn.execute(INSERT_ONE, [f'{{"seq": {n}}}'])
    else:
        asyncio.run(_insert_concurrently(dsn, clients, per_client))
    seconds = time.perf_counter() - started
    return {"jobs": per_client * clients, "jobs_per_s": per_client * clients / seconds}


async def _insert_concurrently(dsn: str, clients: int, per_client: int) -> None:
    async def client() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for n in range(per_client):
                await conn.execute(INSERT_ONE, [f'{{"seq": {n}}}'])

    await asyncio.gather(*(client() for _ in range(clients)))


def insert_one(dsn: str, jobs: int, clients: int, notify: bool = False) -> dict[str, Any]:
    fill(dsn, 0)
    script = "insert_one_notify.sql" if notify else "insert_one.sql"
    per_client = max(1, jobs // clients)
    tps = pgbench(dsn, script, clients=clients, transactions=per_client)
    return {"jobs": per_client * clients, "jobs_per_s": tps}


def insert_many(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    fill(dsn, 0)
    transactions = max(1, jobs // batch)
    tps = pgbench(dsn, "insert_many.sql", clients=1, transactions=transactions, rows=batch)
    return {"jobs": transactions * batch, "jobs_per_s": tps * batch}


def copy(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    """COPY in text format, `batch` rows per transaction, from buffers rendered beforehand."""
    fill(dsn, 0)
    buffers = [
        "".join(f'default\tnoop\t{{"seq": {n}}}\n' for n in range(start, min(start + batch, jobs)))
        for start in range(0, jobs, batch)
    ]
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        for buffer in buffers:
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY {SCHEMA}.jobs (queue, task, args) FROM STDIN") as pipe,
            ):
                pipe.write(buffer)
            conn.commit()
        seconds = time.perf_counter() - started
    return {"jobs": jobs, "jobs_per_s": jobs / seconds}
