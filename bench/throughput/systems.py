"""The systems the throughput bench compares, behind one small interface.

Owns: for each system (pgqueue here; the peers in bench/throughput/peers.py), how to install
its tables, pre-insert no-op jobs, enqueue (one per transaction, and in bulk) and run a worker
(until the queue is empty, or until told to stop) at each of the settings its documentation
gives for running it (`settings`, each with the name the results show). Every worker runs the same
`async def` no-op handler, which records when it started for the latency workloads
(`Recorder`). Everything here runs inside the bench's own database, made and dropped by
bench/throughput/suite.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import psycopg

SCHEMA = "pgqueue_bench"
QUEUE = "default"
TASK = "noop"


class Recorder:
    """Start times of handler calls, in the worker process: `seq time.time()` per line."""

    def __init__(self) -> None:
        self.file: TextIO | None = None
        self.first: float | None = None
        self.count = 0
        self.target: int | None = None
        self.done = threading.Event()

    def open(self, path: Path | None, target: int | None = None) -> None:
        """Record to `path`; with `target`, set `done` once that many handlers started."""
        self.file = path.open("a", buffering=1) if path is not None else None
        self.first = None
        self.count = 0
        self.target = target

    def record(self, seq: int) -> None:
        now = time.time()
        if self.first is None:
            self.first = now
        self.count += 1
        if self.count == self.target:
            self.done.set()
        if self.file is not None:
            self.file.write(f"{seq} {now:.6f}\n")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


RECORDER = Recorder()


class System(Protocol):
    """What the bench needs of a job queue. `dsn` is the bench database."""

    name: str

    def install(self, dsn: str) -> None: ...
    def reset(self, dsn: str) -> None: ...
    def prefill(self, dsn: str, jobs: int) -> None: ...
    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None: ...
    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None: ...
    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None: ...
    def producer(self, dsn: str) -> Producer: ...
    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        """The documented ways to run a worker, by the name the results give each: for at
        most `concurrency` jobs at once, or (None) those that set no such cap."""

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        """Run a worker at `setting` until `stop` is set; return once it has written its
        outcomes."""


class Producer(Protocol):
    """Enqueues one job per transaction and returns once it is committed."""

    def enqueue(self, seq: int) -> None: ...
    def close(self) -> None: ...


def truncate(dsn: str, *tables: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in tables:
            conn.execute(f"TRUNCATE {table} RESTART IDENTITY CASCADE")  # bench-only, fixed names
        conn.execute("VACUUM ANALYZE")


def chunks(seqs: Sequence[int], size: int) -> list[Sequence[int]]:
    return [seqs[i : i + size] for i in range(0, len(seqs), size)]


async def stop_when(stop: threading.Event, action: Callable[[], Any]) -> None:
    """Call `action` once `stop` is set (it is set from another thread)."""
    while not stop.is_set():
        await asyncio.sleep(0.005)
    action()


# -- pgqueue -----------------------------------------------------------------------------------


def _pgqueue_app(dsn: str | None, async_: bool = False) -> tuple[Any, Any]:
    from pgqueue import AsyncQueue, Queue

    queue: Any = (AsyncQueue if async_ else Queue)(dsn, schema=SCHEMA)

    @queue.task(name=TASK, queue=QUEUE)
    async def noop(seq: int) -> None:
        RECORDER.record(seq)

    return queue, noop


class PgQueue:
    """pgqueue at its defaults: batch_size 100, history kept, LISTEN/NOTIFY wake-ups."""

    name = "pgqueue"

    def install(self, dsn: str) -> None:
        from pgqueue.migrate import apply

        with psycopg.connect(dsn, autocommit=True) as conn:
            apply(conn, SCHEMA)

    def reset(self, dsn: str) -> None:
        truncate(dsn, f"{SCHEMA}.jobs", f"{SCHEMA}.job_history", f"{SCHEMA}.workers")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        queue, noop = _pgqueue_app(None)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for seq in seqs:
                queue.enqueue(noop.job(seq), conn=conn)

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        queue, noop = _pgqueue_app(None, async_=True)

        async def client(part: Sequence[int]) -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                for seq in part:
                    await queue.enqueue(noop.job(seq), conn=conn)

        async def main() -> None:
            await asyncio.gather(*(client(seqs[n::clients]) for n in range(clients)))

        asyncio.run(main())

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        queue, noop = _pgqueue_app(None)
        with psycopg.connect(dsn) as conn:
            for part in chunks(seqs, batch):
                queue.enqueue_many([noop.job(seq) for seq in part], conn=conn)
                conn.commit()

    def producer(self, dsn: str) -> Producer:
        queue, noop = _pgqueue_app(None)
        conn = psycopg.connect(dsn, autocommit=True)

        class One:
            def enqueue(self, seq: int) -> None:
                queue.enqueue(noop.job(seq), conn=conn)

            def close(self) -> None:
                conn.close()

        return One()

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        """Its defaults at the workload's concurrency: pgqueue always runs with a cap."""
        return {} if concurrency is None else {"default": {}}

    def variants(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        """Settings run only when named (`--setting pgqueue=NAME`): what a default is worth."""
        return {} if concurrency is None else {"claim_cooldown=0": {"claim_cooldown": 0}}

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        from pgqueue import Worker

        queue, _ = _pgqueue_app(dsn)
        knobs = (self.settings(concurrency) | self.variants(concurrency))[setting]
        worker = Worker(queue, dsn=dsn, concurrency=concurrency or 10, **knobs)
        watcher = asyncio.create_task(stop_when(stop, worker.stop))
        try:
            await worker.run_async()
        finally:
            watcher.cancel()
