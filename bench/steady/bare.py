"""`bound_python`: pgqueue's lifecycle in bare SQL from the least a Python worker can be,
run and measured as a queue is.

Owns: a system (bench/throughput/systems.py's protocol) on pgqueue's own tables with no
library between the bench and psycopg. Its producers send insert_one.sql's INSERT, as
`bound_psycopg`'s do; its worker is one asyncio process that leases up to 100 queued jobs
(the statement of bench/throughput/raw.py's psycopg lifecycle), awaits a coroutine per job
that logs its start, hands the ids to a second connection that finishes everything run since
its last finish into history in one statement, as pgqueue's worker does, and sleeps 1 ms when
the lease found nothing, as the pgbench bound does. No registry, no concurrency limit, no
outcomes, no wake-ups, no error handling.

The other bounds read latency from the rows (created_at to started_at, two server clocks in
two transactions); this one is measured as every queue is, from the producer's commit to the
handler's start, on the clocks of the processes that see them. So it tells what a point
costs any Python worker on this machine: the time a leased batch waits for the worker's
process to get a core is in it, as it is in pgqueue's figure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.throughput import raw
from bench.throughput.systems import RECORDER, SCHEMA, PgQueue, Producer

BATCH = 100  # as pgqueue's default batch and concurrency
POLL_SECONDS = 0.001  # worker.sql's sleep when the lease finds nothing
SETTING = "lease 100, finish apart, 1 ms poll"


async def _started(seq: int) -> None:
    RECORDER.record(seq)


class BarePython:
    """The bound as a system the steady suite runs like a queue."""

    name = "bound_python"

    def install(self, dsn: str) -> None:
        PgQueue().install(dsn)  # pgqueue's tables, as the other bounds use

    def reset(self, dsn: str) -> None:
        raw.fill(dsn, 0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {SCHEMA}.job_history")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        producer = raw.BareProducer(dsn)
        try:
            for seq in seqs:
                producer.enqueue(seq)
        finally:
            producer.close()

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        self.enqueue_sequential(dsn, seqs)  # not used by the steady suite

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        with psycopg.connect(dsn) as conn:
            conn.execute(
                f"INSERT INTO {SCHEMA}.jobs (queue, task, args)"
                " SELECT 'default', 'noop', jsonb_build_object('seq', s)"
                " FROM unnest(%s::bigint[]) AS s",
                [list(seqs)],
            )

    def producer(self, dsn: str) -> Producer:
        return raw.BareProducer(dsn)

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        return {SETTING: {}}

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        handlers = {"noop": _started}
        worker = 7
        ran: asyncio.Queue[list[int] | None] = asyncio.Queue()

        async def lease(conn: psycopg.AsyncConnection[Any]) -> None:
            while not stop.is_set():
                cur = await conn.execute(raw.LEASE, {"worker": worker, "batch": BATCH})
                rows = await cur.fetchall()
                if not rows:
                    await asyncio.sleep(POLL_SECONDS)
                    continue
                for _, task, args in rows:
                    await handlers[task](**args)
                ran.put_nowait([row[0] for row in rows])
            ran.put_nowait(None)

        async with (
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as first,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as second,
        ):
            await asyncio.gather(lease(first), raw.finish_apart(second, ran, worker))


class BarePythonPgQueueEnqueue(BarePython):
    """`bound_python_enqueue`: the bare worker fed by pgqueue's producers. Set beside pgqueue
    and bound_python at a point, it parts what pgqueue's enqueue costs the point from what its
    worker does: the producers are the same as pgqueue's, the worker the bare one."""

    name = "bound_python_enqueue"

    def producer(self, dsn: str) -> Producer:
        return PgQueue().producer(dsn)
