"""The Python peers the throughput bench compares pgqueue with, each on its documented fast path.

- procrastinate 3.10 (psycopg 3): `defer_async` one job per transaction, `batch_defer_async`
  for bulk; `run_worker_async(concurrency=N, wait=False)` drains. It claims one job per query.
- PgQueuer 1.6 (asyncpg, pool driver, durable tables): `Queries.enqueue` with a scalar for one
  job and lists for bulk; `QueueManager.run(batch_size=10, mode=drain)` drains. Its
  `max_concurrent_tasks` must be at least twice its batch size, so concurrency N runs with
  batch size max(1, min(10, N // 2)) and max_concurrent_tasks max(N, 2 x batch).
- oban-py (PyPI `oban`) needs Python >= 3.12; where the bench runs on an older Python it is
  reported as not runnable (throughput.py, `OBAN_NOTE`).

Both install into the `public` schema of the bench's own database.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.throughput.systems import RECORDER, TASK, Producer, chunks, stop_when, truncate

PGQUEUER_BATCH = 10


def _procrastinate_app(dsn: str, max_size: int = 10) -> tuple[Any, Any]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=max_size))

    @app.task(name=TASK)
    async def noop(seq: int) -> None:
        RECORDER.record(seq)

    return app, noop


class Procrastinate:
    name = "procrastinate"

    def install(self, dsn: str) -> None:
        async def main() -> None:
            app, _ = _procrastinate_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(main())

    def reset(self, dsn: str) -> None:
        truncate(dsn, "procrastinate_jobs")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        async def main() -> None:
            app, noop = _procrastinate_app(dsn, 1)
            async with app.open_async():
                for seq in seqs:
                    await noop.defer_async(seq=seq)

        asyncio.run(main())

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        async def main() -> None:
            app, noop = _procrastinate_app(dsn, clients)
            async with app.open_async():

                async def client(part: Sequence[int]) -> None:
                    for seq in part:
                        await noop.defer_async(seq=seq)

                await asyncio.gather(*(client(seqs[n::clients]) for n in range(clients)))

        asyncio.run(main())

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        async def main() -> None:
            app, noop = _procrastinate_app(dsn, 1)
            async with app.open_async():
                for part in chunks(seqs, batch):
                    await noop.batch_defer_async(*({"seq": seq} for seq in part))

        asyncio.run(main())

    def producer(self, dsn: str) -> Producer:
        app, noop = _procrastinate_app(dsn, 1)
        app.open()

        class One:
            def enqueue(self, seq: int) -> None:
                noop.defer(seq=seq)

            def close(self) -> None:
                app.close()

        return One()

    async def work(self, dsn: str, concurrency: int, stop: threading.Event) -> None:
        app, _ = _procrastinate_app(dsn, concurrency + 2)
        async with app.open_async():
            running = asyncio.create_task(
                app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
            )
            watcher = asyncio.create_task(stop_when(stop, running.cancel))
            try:
                await running
            except asyncio.CancelledError:
                if not stop.is_set():
                    raise
            finally:
                watcher.cancel()


class PgQueuer:
    name = "pgqueuer"

    def install(self, dsn: str) -> None:
        async def main(queries: Any) -> None:
            await queries.install()

        _with_queries(dsn, main)

    def reset(self, dsn: str) -> None:
        truncate(dsn, "pgqueuer", "pgqueuer_log", "pgqueuer_statistics")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        async def main(queries: Any) -> None:
            for seq in seqs:
                await queries.enqueue(TASK, str(seq).encode())

        _with_queries(dsn, main)

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        async def main(queries: Any) -> None:
            async def client(part: Sequence[int]) -> None:
                for seq in part:
                    await queries.enqueue(TASK, str(seq).encode())

            await asyncio.gather(*(client(seqs[n::clients]) for n in range(clients)))

        _with_queries(dsn, main, pool=clients)

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        async def main(queries: Any) -> None:
            for part in chunks(seqs, batch):
                payloads = [str(seq).encode() for seq in part]
                await queries.enqueue([TASK] * len(part), payloads, [0] * len(part))

        _with_queries(dsn, main)

    def producer(self, dsn: str) -> Producer:
        return _PgQueuerProducer(dsn)

    async def work(self, dsn: str, concurrency: int, stop: threading.Event) -> None:
        import asyncpg
        from pgqueuer import QueueManager
        from pgqueuer.db import AsyncpgPoolDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries

        batch = max(1, min(PGQUEUER_BATCH, concurrency // 2))
        async with asyncpg.create_pool(url(dsn), min_size=2, max_size=4) as pool:
            manager = QueueManager(Queries(AsyncpgPoolDriver(pool)))

            @manager.entrypoint(TASK)
            async def noop(job: Job) -> None:
                RECORDER.record(int(job.payload or b"0"))

            watcher = asyncio.create_task(stop_when(stop, manager.shutdown.set))
            try:
                await manager.run(
                    batch_size=batch,
                    max_concurrent_tasks=max(concurrency, 2 * batch),
                )
            finally:
                watcher.cancel()


def url(dsn: str) -> str:
    """asyncpg takes URLs only: the same connection settings as a postgresql:// URL."""
    from urllib.parse import quote

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    auth = quote(str(info.get("user", "")), safe="")
    if info.get("password"):
        auth += ":" + quote(str(info["password"]), safe="")
    host = str(info.get("host", "localhost"))
    port, dbname = info.get("port", 5432), info.get("dbname", "")
    if host.startswith("/"):
        return f"postgresql://{auth}@/{dbname}?host={quote(host, safe='')}&port={port}"
    return f"postgresql://{auth}@{host}:{port}/{dbname}"


def _with_queries(dsn: str, body: Any, pool: int = 1) -> None:
    async def main() -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgPoolDriver
        from pgqueuer.queries import Queries

        async with asyncpg.create_pool(url(dsn), min_size=pool, max_size=pool) as connections:
            await body(Queries(AsyncpgPoolDriver(connections)))

    asyncio.run(main())


class _PgQueuerProducer:
    """PgQueuer is async-only: a private event loop in a thread serves the sync producer."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.queries: Any = self._call(self._open(dsn))

    async def _open(self, dsn: str) -> Any:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.conn = await asyncpg.connect(url(dsn))
        return Queries(AsyncpgDriver(self.conn))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def enqueue(self, seq: int) -> None:
        self._call(self.queries.enqueue(TASK, str(seq).encode()))

    def close(self) -> None:
        self._call(self.conn.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
