"""The worker: claim -> execute -> complete, with heartbeats and a clean shutdown.

Owns: one event loop and its connections: claims (also promotion and rescue, one operation at
a time), the completer's, the notifier's, one per atomic lane, and the heartbeat thread's. It
runs at most `concurrency` jobs at once: `async def` handlers as tasks on the loop, `def`
handlers in a thread pool (with headroom for sync jobs that outlived their timeout).

Claims go through the Claimer (claimer.py: batches, the hint and its resets, promotion of
due scheduled jobs); leases through the heartbeat thread and the rescuer; atomic jobs through
their own lanes (atomic.py). Recurring jobs (periodic.py) and history retention (retention.py)
each get a connection of their own, only when the application has recurring jobs or
`history_retention` is set, and never in burst mode.

Cancellation of a running job reaches the worker as a notification ('!cancel <id>' on the
wake-up channel), with a check every rescue interval as the fallback: an async handler is
cancelled, a sync one sees `ctx.cancel_requested`; the job ends as cancelled.

Stopping (SIGTERM/SIGINT, or stop()): claiming stops, running jobs get `shutdown_grace` to
finish, the rest are cancelled and put back as queued without spending an attempt, outcomes
are flushed, and the worker row is removed. A second signal skips the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads

from pgqueue import tenants
from pgqueue.atomic import AtomicLane
from pgqueue.claimer import Claimer, WorkerStats
from pgqueue.completer import OUTCOME_BATCH, Completer
from pgqueue.errors import DatabaseError
from pgqueue.executor import Executor, cancelled
from pgqueue.heartbeat import Heartbeat
from pgqueue.link import Link
from pgqueue.models import ClaimedJob, QueueSettings, WorkerSettings
from pgqueue.notifier import Notifier
from pgqueue.periodic import Scheduler
from pgqueue.queries import query
from pgqueue.queue import ATOMIC_MAX_TIMEOUT
from pgqueue.registry import CancelSignal, Registry, decode_json
from pgqueue.rescuer import Rescuer
from pgqueue.retention import Pruner
from pgqueue.schedule import Schedules
from pgqueue.wakeup import Position

log = logging.getLogger("pgqueue.worker")
STRAGGLER_THREADS = 64
HORIZON_WARNING_EVERY = 60.0  # seconds between two horizon warnings of one worker


class Worker:
    """Runs the registered tasks of a Queue or AsyncQueue against `dsn`."""

    def __init__(
        self,
        queue: Any,
        *,
        dsn: str,
        settings: WorkerSettings | None = None,
        schema: str | None = None,
        **overrides: Any,
    ) -> None:
        self.registry: Registry = queue.registry
        self.periodics: Schedules = queue.periodics
        self.scheduler: Scheduler | None = None  # set at start when it has recurring jobs
        self.pruner: Pruner | None = None  # set at start with history_retention
        self.queue_settings: QueueSettings = queue.settings
        if schema is not None:
            self.queue_settings = self.queue_settings.model_copy(
                update={"schema_name": QueueSettings(schema=schema).schema_name}
            )
        self.schema: str = self.queue_settings.schema_name
        self.dsn = dsn
        self.settings = settings or WorkerSettings(**overrides)
        self.id = 0
        self.stats = WorkerStats()
        self.abandoned_threads = 0
        self._running: dict[asyncio.Task[None], ClaimedJob] = {}
        self._cancels: dict[int, CancelSignal] = {}  # running lease jobs by id
        self._unfinished: list[ClaimedJob] = []
        self._stopping = False
        self._force = False
        self._maybe_more = True
        self._retried_seen = 0
        self._floor_checked = False  # burst mode: an empty claim from the floor since work
        self._wakes = 0  # wake-ups so far: one during a claim means claim again
        self.horizon_checks = 0
        self._next_horizon_warning = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._forced: asyncio.Event | None = None
        self._atomic_wake = asyncio.Event()
        self._lanes: list[asyncio.Task[None]] = []
        self.lanes: list[AtomicLane] = []

    # -- public -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped by SIGTERM/SIGINT (or, with burst, until the queues are empty)."""
        asyncio.run(self.run_async(handle_signals=True))

    async def run_async(self, *, handle_signals: bool = False) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._forced = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._serve()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop; safe to call from any thread or a signal handler."""
        if self._loop is None:
            self._stopping = True
            return
        self._loop.call_soon_threadsafe(self._request_stop, force)

    # -- lifecycle --------------------------------------------------------------------------

    async def _serve(self) -> None:
        s = self.settings
        prepare = not s.poll_only
        self._claims = Link(
            self.dsn,
            "claim",
            prepare=prepare,
            on_connect=self._claim_session,
            on_reconnect=self._release_orphans,
        )
        await self._claims.open()
        await self._check_schema()
        finish_link = Link(self.dsn, "complete", prepare=prepare, on_connect=self._planner_session)
        await finish_link.open()
        self.id = await self._register(finish_link)
        self.claimer = Claimer(self._claims, self.schema, s, self.id, self.stats)
        self.completer = Completer(
            finish_link,
            self.schema,
            self.queue_settings.keep_history,
            max(s.batch_size, OUTCOME_BATCH),
        )
        # Threads start lazily. The headroom beyond `concurrency` is for sync jobs that ran past
        # their timeout: they keep their thread, but their slot is free for the next job.
        threads = ThreadPoolExecutor(
            s.concurrency + STRAGGLER_THREADS, thread_name_prefix="pgqueue-job"
        )
        self.executor = Executor(self.registry, threads, self.queue_settings.max_payload_bytes)
        self.rescuer = Rescuer(
            self.registry, self.schema, s.lease_timeout, self.queue_settings.keep_history
        )
        heartbeat = Heartbeat(
            self.dsn, self.schema, self._identity() | {"worker_id": self.id}, s.heartbeat_interval
        )
        heartbeat.start()
        helpers = [
            asyncio.create_task(self.completer.run(), name="pgqueue-complete"),
            asyncio.create_task(self._rescue_loop(), name="pgqueue-rescue"),
        ]
        self.lanes = self._atomic_lanes()
        self._lanes = [
            asyncio.create_task(lane.run(), name=f"pgqueue-atomic-{n}")
            for n, lane in enumerate(self.lanes)
        ]
        helpers += self._maintenance()
        notifier = None
        if not s.poll_only:
            notifier = Notifier(
                self.dsn,
                self.schema,
                set(s.queues),
                self._announced,
                self._relistened,
                self._cancel_requested,
            )
            helpers.append(asyncio.create_task(notifier.run(), name="pgqueue-listen"))
        log.info(
            "worker %s started: queues=%s concurrency=%s schema=%s%s",
            self.id,
            ",".join(s.queues),
            s.concurrency,
            self.schema,
            " (poll only)" if s.poll_only else "",
        )
        try:
            await self._fetch_loop()
        finally:
            self._stopping = True  # also after a burst ends: atomic lanes stop with it
            await self._drain(threads, self._lanes)
            self.completer.close()
            await helpers[0]
            for helper in helpers[1:]:
                helper.cancel()
            await asyncio.gather(*helpers[1:], return_exceptions=True)
            await self._cancel_unfinished()
            await self._release_unfinished()
            heartbeat.stop()
            await self._claims.run(self._deregister)
            if notifier is not None:
                await notifier.close()
            await finish_link.close()
            await self._claims.close()
            threads.shutdown(wait=False, cancel_futures=True)
            log.info(
                "worker %s stopped: %s jobs claimed, %s put back",
                self.id,
                self.stats.claimed,
                len(self._unfinished),
            )

    def _maintenance(self) -> list[asyncio.Task[None]]:
        """The periodic scheduler and the history pruner, each on a connection of its own,
        when this worker has something for them to do (never in burst mode)."""
        s = self.settings
        tasks = []
        prepare = not s.poll_only
        if s.periodic and len(self.periodics) and not s.burst:
            scheduler = self.scheduler = Scheduler(self.periodics, self.schema, self.id)
            link = Link(self.dsn, "periodic", prepare=prepare)
            tasks.append(asyncio.create_task(scheduler.run(link), name="pgqueue-periodic"))
        if s.history_retention is not None and not s.burst:
            pruner = self.pruner = Pruner(
                self.schema, s.history_retention, s.prune_interval, s.prune_batch
            )
            link = Link(self.dsn, "prune", prepare=prepare)
            tasks.append(asyncio.create_task(pruner.run(link), name="pgqueue-prune"))
        return tasks

    async def _claim_session(self, conn: Any) -> None:
        """The claim connection commits without waiting for its WAL flush: a job starts that
        much sooner after a wake-up (bench/README.md, idle latency). Safe for lease claims and
        for everything else this connection writes (promotions, put-backs, rescues, the
        deregistration): a commit lost in a crash leaves the rows as they were, which the
        rescuer, the heartbeat and the next reconnect's orphan release already handle, and the
        completer's synchronous commit flushes the claim's WAL before any outcome is durable.
        Not for the worker's registration (_register) nor atomic lanes, whose transaction
        carries the handler's writes
        (tests/integration/test_worker.py::test_session_settings_stay_on_the_workers_own_connections)."""
        await conn.execute(query("session_set_async_commit", self.schema))
        await self._planner_session(conn)
        set_json_loads(decode_json, conn)  # each claimed job's arguments

    async def _planner_session(self, conn: Any) -> None:
        """The claim and completer connections plan for index access (worker.sql,
        session_prefer_indexes)."""
        await conn.execute(query("session_prefer_indexes", self.schema))

    async def _check_schema(self) -> None:
        async def check(conn: Any) -> bool:
            cur = await conn.execute(
                query("migration_table_exists", self.schema), {"schema": self.schema}
            )
            row = await cur.fetchone()
            return bool(row and row[0])

        if not await self._claims.run(check):
            raise DatabaseError(
                f"schema {self.schema!r} has no pgqueue tables: run `pgqueue migrate` first"
            )

    def _identity(self) -> dict[str, Any]:
        s = self.settings
        return {
            "name": s.name or f"{socket.gethostname()}:{os.getpid()}",
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(s.queues),
            "concurrency": s.concurrency,
        }

    async def _register(self, link: Link) -> int:
        """The worker's row, on a connection whose commits wait for the WAL flush (the
        completer's): with the claim connection's asynchronous commit, a server crash could
        lose the row and its id, which a later worker would then get while this one still
        heartbeats under it."""

        async def register(conn: Any) -> int:
            cur = await conn.execute(query("worker_register", self.schema), self._identity())
            row = await cur.fetchone()
            return int(row[0])

        return await link.run(register)

    async def _deregister(self, conn: Any) -> None:
        await conn.execute(query("worker_deregister", self.schema), {"worker_id": self.id})

    async def _rescue_loop(self) -> None:
        """Every rescue_interval (± 50%), look for jobs of dead workers, then sweep the
        concurrency slots (tenants.py)."""
        interval = self.settings.rescue_interval.total_seconds()
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))
            if await self._claims.run(self.rescuer.rescue):
                self._notified()  # rescued jobs may be claimable now
            await self._check_cancels()
            if await self._claims.run(lambda conn: tenants.sweep(conn, self.schema)):
                self._notified()  # waiting jobs of keys with room are queued again
            await self._watch_horizon()

    async def _watch_horizon(self) -> None:
        """Warn, at most once a minute, while something holds the xmin horizon back for longer
        than horizon_warning: VACUUM cannot clean the jobs table meanwhile (seed 002)."""
        self.horizon_checks += 1
        if time.monotonic() < self._next_horizon_warning:
            return

        async def oldest(conn: Any) -> list[dict[str, Any]]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(
                    query("horizon_list_holders", self.schema),
                    {"min_age": self.settings.horizon_warning, "now": None},
                )
                rows: list[dict[str, Any]] = await cur.fetchall()
                return rows

        holders = await self._claims.run(oldest)
        if holders:
            top = holders[0]
            self._next_horizon_warning = time.monotonic() + HORIZON_WARNING_EVERY
            log.warning(
                "%d sessions have held back the xmin horizon for over %s, so VACUUM cannot clean "
                "the jobs table; the oldest: %s pid=%s application=%r state=%s age=%s query=%r "
                "(see `pgqueue status`, `pgqueue watchdog`)",
                len(holders),
                self.settings.horizon_warning,
                top["kind"],
                top["pid"],
                top["application_name"],
                top["state"],
                top["age"],
                (top["query"] or "")[:80],
            )

    # -- claiming ---------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        s = self.settings
        poll = s.poll_interval.total_seconds()
        next_poll = 0.0
        while not self._stopping:
            free = s.concurrency - len(self._running)
            now = time.monotonic()
            if now >= next_poll:
                self._maybe_more = True
            if self.claimer.promotion_due(now) and await self.claimer.promote():
                self._maybe_more = True
            full = False
            if free > 0 and self._maybe_more:
                wakes = self._wakes
                jobs, full = await self.claimer.claim_round(free)
                if jobs:
                    self._floor_checked = False
                for job in jobs:
                    self._start(job)
                # A wake-up that arrived while the claim ran may be for a job it did not see.
                self._maybe_more = full or self._wakes != wakes
                next_poll = time.monotonic() + poll
            if s.burst and not full and not self._running and await self._burst_done():
                break
            if self._maybe_more and len(self._running) < s.concurrency:
                continue
            await self._sleep(min(next_poll, self.claimer.next_wake()) - time.monotonic())

    async def _burst_done(self) -> bool:
        """In burst mode: nothing running, nothing claimable, nothing due to promote.

        "Nothing claimable" is only believed after a claim from the floor came back empty:
        a wake-up naming a job below the hint may still be on its way."""
        if self._running or not all(lane.idle for lane in self.lanes):
            return False
        await self.completer.flushed()
        retried_before, self._retried_seen = self._retried_seen, self.completer.retried
        promoted = await self.claimer.promote()
        if self._retried_seen != retried_before or promoted or not self._floor_checked:
            # Retried or promoted jobs sit below the hints: look from the floor.
            self._floor_checked = True
            self.claimer.forget_hints()
            self._maybe_more = True
            return False
        return True

    # -- running ----------------------------------------------------------------------------

    def _start(self, job: ClaimedJob) -> None:
        task = asyncio.create_task(self._run(job), name=f"pgqueue-job-{job.id}")
        self._running[task] = job
        task.add_done_callback(self._finished)

    async def _run(self, job: ClaimedJob) -> None:
        self._cancels[job.id] = cancel = CancelSignal()
        try:
            outcome = await self.executor.run(job, cancel=cancel)
        except asyncio.CancelledError:
            self._unfinished.append(job)
            raise
        finally:
            del self._cancels[job.id]
        self.completer.add(outcome)

    # -- cancellation -----------------------------------------------------------------------

    def _cancel_requested(self, job_id: int) -> None:
        """Cancellation of a job was requested (a notification, or the fallback check); a job
        this worker is not running is none of its business."""
        cancel = self._cancels.get(job_id)
        if cancel is not None and not cancel.requested:
            log.info("job %s: cancellation requested, stopping it", job_id)
            cancel.request()

    async def _check_cancels(self) -> None:
        """The fallback for a lost notification (or poll_only): look for requests on the
        jobs this worker runs, every rescue interval."""
        if not self._cancels:
            return

        async def requested(conn: Any) -> list[Any]:
            cur = await conn.execute(
                query("job_list_cancel_requested", self.schema),
                {"worker_id": self.id, "ids": list(self._cancels)},
            )
            rows: list[Any] = await cur.fetchall()
            return rows

        for (job_id,) in await self._claims.run(requested):
            self._cancel_requested(job_id)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if self._wake is not None:
            self._wake.set()

    # -- waking and stopping ----------------------------------------------------------------

    def _announced(self, queue: str, position: Position | None) -> None:
        """A wake-up naming where jobs became claimable (claimer.py)."""
        self.claimer.announce(queue, position)
        self._notified()

    def _relistened(self) -> None:
        """Listening (again): wake-ups sent meanwhile were missed, so claim from the floor."""
        self.claimer.forget_hints()
        self._notified()

    def _notified(self) -> None:
        self._wakes += 1
        self._maybe_more = True
        self._atomic_wake.set()
        if self._wake is not None:
            self._wake.set()

    def _atomic_lanes(self) -> list[AtomicLane]:
        """`atomic_concurrency` lanes for the async atomic tasks, as many for the sync ones."""
        atomic = [t for t in self.registry if t.atomic and t.fn is not None]
        if not atomic or self.settings.atomic_concurrency == 0:
            return []
        timeout = max(t.policy.timeout or ATOMIC_MAX_TIMEOUT for t in atomic)
        lanes = []
        for sync in (False, True):
            tasks = sorted(t.name for t in atomic if t.is_async != sync)
            lanes += [
                AtomicLane(
                    dsn=self.dsn,
                    schema=self.schema,
                    queues=list(self.settings.queues),
                    tasks=tasks,
                    timeout_ms=int(timeout.total_seconds() * 1000),
                    executor=self.executor,
                    keep_history=self.queue_settings.keep_history,
                    worker_id=self.id,
                    stopping=lambda: self._stopping,
                    wait=self._atomic_idle,
                    done=self._notified,
                    sync=sync,
                )
                for _ in range(self.settings.atomic_concurrency if tasks else 0)
            ]
        return lanes

    async def _atomic_idle(self) -> None:
        """An atomic lane found nothing: wait for a notification or the next poll."""
        if not self._atomic_wake.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._atomic_wake.wait(), self.settings.poll_interval.total_seconds()
                )
        self._atomic_wake.clear()

    async def _sleep(self, timeout: float) -> None:
        assert self._wake is not None
        if timeout > 0 and not self._wake.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    def _on_signal(self, sig: signal.Signals) -> None:
        force = self._stopping
        log.warning(
            "received %s: %s",
            sig.name,
            "stopping now, putting running jobs back"
            if force
            else f"stopping, giving running jobs {self.settings.shutdown_grace} to finish "
            "(signal again to stop now)",
        )
        self._request_stop(force)

    def _request_stop(self, force: bool) -> None:
        self._stopping = True
        if force:
            self._force = True
            if self._forced is not None:
                self._forced.set()
        if self._wake is not None:
            self._wake.set()

    async def _drain(self, threads: ThreadPoolExecutor, lanes: list[asyncio.Task[None]]) -> None:
        """Give running jobs the grace period, then cancel what is left: lease jobs are put
        back, atomic jobs roll back."""
        assert self._forced is not None
        self._atomic_wake.set()  # idle lanes see the stop at once
        if (self._running or lanes) and not self._force:
            forced = asyncio.create_task(self._forced.wait())
            deadline = time.monotonic() + self.settings.shutdown_grace.total_seconds()
            while (self._running or any(not lane.done() for lane in lanes)) and not self._force:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    [*self._running, *(lane for lane in lanes if not lane.done()), forced],
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            forced.cancel()
        leftover = list(self._running) + [lane for lane in lanes if not lane.done()]
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        # Sync handlers cannot be interrupted; their threads run on but their jobs are put
        # back, and any late outcome is refused by the completion guard.
        self.abandoned_threads = sum(
            1 for job in self._unfinished if not _is_async(self.registry, job.task)
        )

    async def _release_orphans(self, conn: Any) -> None:
        """Put back jobs a claim took for us but whose reply the broken connection lost."""
        if not self.id:
            return
        known = [job.id for job in self._running.values()] + self.completer.job_ids()
        known += [job.id for job in self.claimer.in_hand]  # claimed this round, not yet started
        cur = await conn.execute(
            query("job_release_orphans", self.schema), {"worker_id": self.id, "known": known}
        )
        orphans = await cur.fetchall()
        if orphans:
            log.warning("put back %d jobs claimed while the connection broke", len(orphans))
            self.claimer.forget_hints()  # they sit below any hint now
            self._notified()  # and nobody else was told they are back

    async def _cancel_unfinished(self) -> None:
        """Unfinished jobs whose cancellation was requested (and not heard of in time) end as
        cancelled instead of going back to run again; guarded like any outcome."""
        if not self._unfinished:
            return

        async def cancel(conn: Any) -> list[ClaimedJob]:
            cur = await conn.execute(
                query("job_list_cancel_requested", self.schema),
                {"worker_id": self.id, "ids": [job.id for job in self._unfinished]},
            )
            requested = {row[0] for row in await cur.fetchall()}
            jobs = [job for job in self._unfinished if job.id in requested]
            if jobs:
                outcomes = [cancelled(job, None).as_row() for job in jobs]
                params = {
                    "outcomes": json.dumps(outcomes),
                    "keep_history": self.queue_settings.keep_history,
                    "now": None,
                }
                await conn.execute(query("job_finish_many", self.schema), params)
            return jobs

        done = await self._claims.run(cancel)
        if done:
            log.info("cancelled %d unfinished jobs whose cancellation was requested", len(done))
            self._unfinished = [job for job in self._unfinished if job not in done]

    async def _release_unfinished(self) -> None:
        if not self._unfinished:
            return
        ids = [job.id for job in self._unfinished]

        async def release(conn: Any) -> None:
            await conn.execute(
                query("job_release_many", self.schema), {"ids": ids, "worker_id": self.id}
            )

        await self._claims.run(release)
        log.warning("put %d unfinished jobs back in their queues", len(ids))


def _is_async(registry: Registry, name: str) -> bool:
    try:
        return registry.get(name).is_async
    except Exception:
        return True
