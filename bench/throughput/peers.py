"""The Python peers the throughput bench compares pgqueue with, each run as its documentation
says, at each of a few settings that documentation gives (`settings`); the results keep every
setting's figures and the tables show each peer's best, naming the setting.

- procrastinate (psycopg 3): schema applied as `procrastinate schema --apply` does;
  `defer_async` one job per transaction, `batch_defer_async` for bulk. Worker settings, from
  its "concurrency" and "pool size" pages: `concurrency=N` with a pool of N + 1 connections
  (one per sub-worker, plus one; its listener has a connection of its own), and with
  psycopg_pool's default pool. It claims one job per query.
- PgQueuer (asyncpg, durable tables): schema as `pgq install` then `pgq autovac` (its
  performance checklist); `Queries.enqueue` with a scalar for one job and lists for bulk.
  Worker settings, from its performance-tuning page: `run()` at its defaults (batch_size 10,
  no cap), batch_size 100 with no cap, on one asyncpg connection as that page advises for the
  QueueManager, and batch_size 100 on a pool of up to 20 (the page's pool example); and for a
  cap of N jobs at once, `max_concurrent_tasks` (which must be at least twice the batch):
  batch min(10, N // 2) and min(100, N // 2), cap max(N, 2 x batch).
- Chancy (psycopg 3, Python >= 3.11): `migrate()` then `declare(Queue(...))` as its quick
  start does; `push` one job per transaction, `push_many` for bulk. Worker setting: the
  queue on Chancy's AsyncExecutor (its executor for asyncio jobs) with `concurrency=N` and
  `eager_polling` (its option for queues that always have work: without it, a worker that
  has taken its jobs sleeps until the next push or its polling interval). Its per-job INFO
  log lines are turned off (WARNING), as pgqueue writes none per job.
- oban-py (PyPI `oban`, psycopg 3, Python >= 3.12): schema by `oban.schema.install`, the
  Python way of its installation guide; `enqueue` one job per transaction (each call takes a
  pool connection and commits), `enqueue_many` for bulk; pools from `Oban.create_pool`, as
  its quick start makes them. Worker settings: the queue's `limit=N` (jobs at once), on
  `create_pool`'s default pool (1 to 10 connections, which its production guide calls
  comfortable for most deployments) and on the 2 to 20 of that guide's sizing example. No
  per-job log lines: oban-py writes them only once its telemetry logger is attached. Where
  the bench runs on an older Python it is reported as not run (suite.py).

All install into the `public` schema of the bench's own database.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.throughput.systems import RECORDER, TASK, Producer, chunks, stop_when, truncate

PGQUEUER_BATCHES = (10, 100)  # its default batch_size, and the larger one its docs suggest
PGQUEUER_POOL = 20  # the pool in the pool example of PgQueuer's performance-tuning page
PSYCOPG_POOL_DEFAULT = 4  # psycopg_pool's own min_size (and so max_size) when none is given


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
        """What `procrastinate schema --apply` runs."""

        async def main() -> None:
            app, _ = _procrastinate_app(dsn)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(main())

    def reset(self, dsn: str) -> None:
        truncate(dsn, "procrastinate_jobs")

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        if concurrency is None:
            return {}
        return {
            f"concurrency={concurrency}, pool {concurrency + 1}": {"pool": concurrency + 1},
            f"concurrency={concurrency}, default pool ({PSYCOPG_POOL_DEFAULT})": {
                "pool": PSYCOPG_POOL_DEFAULT
            },
        }

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

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        knobs = self.settings(concurrency)[setting]
        app, _ = _procrastinate_app(dsn, knobs["pool"])
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
        """`pgq install`, then `pgq autovac`, as PgQueuer's performance checklist asks."""
        for command in ("install", "autovac"):
            done = subprocess.run(
                [sys.executable, "-m", "pgqueuer", "--pg-dsn", url(dsn), command],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"pgq {command} failed: {done.stderr.strip()[-500:]}")

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        if concurrency is None:
            return {
                "batch_size=10 (default), no cap": {"batch": 10, "cap": None, "pool": None},
                "batch_size=100, no cap": {"batch": 100, "cap": None, "pool": None},
                f"batch_size=100, no cap, pool {PGQUEUER_POOL}": {
                    "batch": 100,
                    "cap": None,
                    "pool": PGQUEUER_POOL,
                },
            }
        found: dict[str, dict[str, Any]] = {}
        for most in PGQUEUER_BATCHES:
            batch = max(1, min(most, concurrency // 2))
            cap = max(concurrency, 2 * batch)
            found[f"batch_size={batch}, max_concurrent_tasks={cap}"] = {
                "batch": batch,
                "cap": cap,
                "pool": None,
            }
        return found

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

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        import asyncpg
        from pgqueuer import QueueManager
        from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries

        knobs = self.settings(concurrency)[setting]
        if knobs["pool"] is None:
            conn = await asyncpg.connect(url(dsn))
            driver: Any = AsyncpgDriver(conn)
            close = conn.close
        else:
            pool = await asyncpg.create_pool(url(dsn), min_size=2, max_size=knobs["pool"])
            driver = AsyncpgPoolDriver(pool)
            close = pool.close
        manager = QueueManager(Queries(driver))

        @manager.entrypoint(TASK)
        async def noop(job: Job) -> None:
            RECORDER.record(int(job.payload or b"0"))

        watcher = asyncio.create_task(stop_when(stop, manager.shutdown.set))
        try:
            await manager.run(batch_size=knobs["batch"], max_concurrent_tasks=knobs["cap"])
        finally:
            watcher.cancel()
            await close()


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


class _LoopProducer(abc.ABC):
    """For a peer that is async-only: a private event loop in a thread serves the sync
    producer. Subclasses open their client in `_open`, enqueue in `_enqueue`, close in
    `_close`, each run on that loop."""

    def __init__(self, dsn: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self._open(dsn))

    @abc.abstractmethod
    async def _open(self, dsn: str) -> None: ...

    @abc.abstractmethod
    async def _enqueue(self, seq: int) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def enqueue(self, seq: int) -> None:
        self._call(self._enqueue(seq))

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class _PgQueuerProducer(_LoopProducer):
    async def _open(self, dsn: str) -> None:
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.conn = await asyncpg.connect(url(dsn))
        self.queries = Queries(AsyncpgDriver(self.conn))

    async def _enqueue(self, seq: int) -> None:
        await self.queries.enqueue(TASK, str(seq).encode())

    async def _close(self) -> None:
        await self.conn.close()


# -- Chancy ------------------------------------------------------------------------------------

CHANCY_QUEUE = "default"


def _chancy(dsn: str, pool: int = 10) -> Any:
    from chancy import Chancy

    quiet = logging.getLogger("bench.chancy")
    quiet.setLevel(logging.WARNING)
    return Chancy(dsn, max_connection_pool_size=pool, log=quiet)


def _chancy_job(seq: int) -> Any:
    from bench.throughput.chancy_jobs import noop

    return noop.job.with_kwargs(seq=seq)


class Chancy:
    name = "chancy"

    def install(self, dsn: str) -> None:
        """`migrate()`, as Chancy's quick start does before declaring its queue."""

        async def main() -> None:
            async with _chancy(dsn) as chancy:
                await chancy.migrate()

        asyncio.run(main())

    def reset(self, dsn: str) -> None:
        truncate(dsn, "chancy_jobs")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        async def main() -> None:
            async with _chancy(dsn, 1) as chancy:
                for seq in seqs:
                    await chancy.push(_chancy_job(seq))

        asyncio.run(main())

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        async def main() -> None:
            async with _chancy(dsn, clients) as chancy:

                async def client(part: Sequence[int]) -> None:
                    for seq in part:
                        await chancy.push(_chancy_job(seq))

                await asyncio.gather(*(client(seqs[n::clients]) for n in range(clients)))

        asyncio.run(main())

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        async def main() -> None:
            async with _chancy(dsn, 1) as chancy:
                jobs = [_chancy_job(seq) for seq in seqs]
                async for _ in chancy.push_many(jobs, batch_size=batch):
                    pass

        asyncio.run(main())

    def producer(self, dsn: str) -> Producer:
        chancy = _chancy(dsn, 1)
        chancy.__enter__()

        class One:
            def enqueue(self, seq: int) -> None:
                chancy.sync_push(_chancy_job(seq))

            def close(self) -> None:
                chancy.__exit__(None, None, None)

        return One()

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        if concurrency is None:
            return {}
        return {f"AsyncExecutor, concurrency={concurrency}, eager_polling": {}}

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        from chancy import Queue, Worker

        async with _chancy(dsn, (concurrency or 10) + 2) as chancy:
            await chancy.declare(
                Queue(
                    CHANCY_QUEUE,
                    concurrency=concurrency,
                    executor="chancy.executors.asyncex.AsyncExecutor",
                    eager_polling=True,
                ),
                upsert=True,
            )
            async with Worker(chancy, register_signal_handlers=False):
                await stop_when(stop, lambda: None)


# -- oban-py -----------------------------------------------------------------------------------

OBAN_QUEUE = "default"
# The pool of the pool-sizing example in oban-py's production guide (`pool_min_size = 2`,
# `pool_max_size = 20`); `create_pool`'s own default is 1 to 10.
OBAN_POOL = (2, 20)


async def _oban(dsn: str, min_size: int | None = None, max_size: int | None = None) -> Any:
    """A client-mode Oban (no queues: it only enqueues) on a pool of its own making."""
    from oban import Oban

    pool = await Oban.create_pool(dsn, min_size=min_size, max_size=max_size)
    return Oban(pool=pool), pool


def _oban_job(seq: int) -> Any:
    from bench.throughput.oban_jobs import Noop

    return Noop.new({"seq": seq})


class ObanPy:
    name = "oban"

    def install(self, dsn: str) -> None:
        """`oban.schema.install(pool)`, the Python way of oban-py's installation guide."""

        async def main() -> None:
            from oban.schema import install

            _, pool = await _oban(dsn)
            try:
                await install(pool)
            finally:
                await pool.close()

        asyncio.run(main())

    def reset(self, dsn: str) -> None:
        truncate(dsn, "oban_jobs", "oban_producers", "oban_leaders")

    def prefill(self, dsn: str, jobs: int) -> None:
        self.enqueue_bulk(dsn, range(jobs), 5000)

    def enqueue_sequential(self, dsn: str, seqs: Sequence[int]) -> None:
        async def main() -> None:
            oban, pool = await _oban(dsn, 1, 1)
            try:
                for seq in seqs:
                    await oban.enqueue(_oban_job(seq))
            finally:
                await pool.close()

        asyncio.run(main())

    def enqueue_concurrent(self, dsn: str, seqs: Sequence[int], clients: int) -> None:
        async def main() -> None:
            oban, pool = await _oban(dsn, clients, clients)

            async def client(part: Sequence[int]) -> None:
                for seq in part:
                    await oban.enqueue(_oban_job(seq))

            try:
                await asyncio.gather(*(client(seqs[n::clients]) for n in range(clients)))
            finally:
                await pool.close()

        asyncio.run(main())

    def enqueue_bulk(self, dsn: str, seqs: Sequence[int], batch: int) -> None:
        async def main() -> None:
            oban, pool = await _oban(dsn, 1, 1)
            try:
                for part in chunks(seqs, batch):
                    await oban.enqueue_many([_oban_job(seq) for seq in part])
            finally:
                await pool.close()

        asyncio.run(main())

    def producer(self, dsn: str) -> Producer:
        return _ObanProducer(dsn)

    def settings(self, concurrency: int | None) -> dict[str, dict[str, Any]]:
        """A queue's `limit` is its cap on jobs at once: oban-py always runs with one."""
        if concurrency is None:
            return {}
        low, high = OBAN_POOL
        return {
            f"limit={concurrency}, default pool (1-10)": {"pool": (None, None)},
            f"limit={concurrency}, pool {low}-{high}": {"pool": OBAN_POOL},
        }

    async def work(
        self, dsn: str, concurrency: int | None, stop: threading.Event, setting: str
    ) -> None:
        from oban import Oban

        import bench.throughput.oban_jobs  # noqa: F401  (the worker class, before the clock)

        low, high = self.settings(concurrency)[setting]["pool"]
        pool = await Oban.create_pool(dsn, min_size=low, max_size=high)
        try:
            async with Oban(pool=pool, queues={OBAN_QUEUE: concurrency or 10}):
                await stop_when(stop, lambda: None)
        finally:
            await pool.close()


class _ObanProducer(_LoopProducer):
    async def _open(self, dsn: str) -> None:
        self.oban, self.pool = await _oban(dsn, 1, 1)

    async def _enqueue(self, seq: int) -> None:
        await self.oban.enqueue(_oban_job(seq))

    async def _close(self) -> None:
        await self.pool.close()
