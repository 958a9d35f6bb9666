"""The worker: claim -> execute -> complete, with heartbeats and a clean shutdown.

Owns: one event loop, a claim connection (also used for promotion and heartbeats), the
completer's connection and the notifier's. It runs at most `concurrency` jobs at once:
`async def` handlers as tasks on the loop, `def` handlers in a thread pool of that size.

Claims take a batch of at most the free slots per queue, in (priority, id) order, starting
after a per-queue hint: the last (priority, id) claimed. The hint is forgotten after a
randomised interval (hint_reset_interval ± jitter) and whenever a hinted claim comes back
short, so a job committed late with a lower id, or one promoted from scheduled, waits at most
one reset interval (tests/integration/test_hint.py pins this).

Stopping (SIGTERM/SIGINT, or stop()): claiming stops, running jobs get `shutdown_grace` to
finish, the rest are cancelled and put back as queued without spending an attempt, outcomes
are flushed, and the worker row is removed. A second signal skips the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pgqueue.atomic import AtomicLane
from pgqueue.completer import Completer
from pgqueue.errors import DatabaseError
from pgqueue.executor import Executor
from pgqueue.heartbeat import Heartbeat
from pgqueue.link import Link
from pgqueue.models import ClaimedJob, QueueSettings, WorkerSettings
from pgqueue.notifier import Notifier
from pgqueue.queries import query
from pgqueue.queue import ATOMIC_MAX_TIMEOUT
from pgqueue.registry import Registry
from pgqueue.rescuer import Rescuer

log = logging.getLogger("pgqueue.worker")
FLOOR = (-32768, 0)  # below every (priority, id): an unhinted claim
STRAGGLER_THREADS = 64


@dataclass
class WorkerStats:
    claimed: int = 0
    claims: int = 0
    unhinted_claims: int = 0
    promoted: int = 0
    started: float = field(default_factory=time.monotonic)


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
        self._unfinished: list[ClaimedJob] = []
        self._hints: dict[str, tuple[int, int] | None] = {q: None for q in self.settings.queues}
        self._hint_deadline: dict[str, float] = {q: 0.0 for q in self.settings.queues}
        self._rng = random.Random()
        self._stopping = False
        self._force = False
        self._maybe_more = True
        self._next_promote = 0.0
        self._next_due: float | None = None
        self._retried_seen = 0
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
        self._claims = Link(self.dsn, "claim", prepare=prepare, on_reconnect=self._release_orphans)
        await self._claims.open()
        await self._check_schema()
        finish_link = Link(self.dsn, "complete", prepare=prepare)
        await finish_link.open()
        self.id = await self._register()
        self.completer = Completer(
            finish_link, self.schema, self.queue_settings.keep_history, s.batch_size
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
        notifier = None
        if not s.poll_only:
            notifier = Notifier(self.dsn, self.schema, set(s.queues), self._notified)
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

    async def _register(self) -> int:
        async def register(conn: Any) -> int:
            cur = await conn.execute(query("worker_register", self.schema), self._identity())
            row = await cur.fetchone()
            return int(row[0])

        return await self._claims.run(register)

    async def _deregister(self, conn: Any) -> None:
        await conn.execute(query("worker_deregister", self.schema), {"worker_id": self.id})

    async def _rescue_loop(self) -> None:
        """Every rescue_interval (± 50%), look for jobs of dead workers."""
        interval = self.settings.rescue_interval.total_seconds()
        while True:
            await asyncio.sleep(interval * self._rng.uniform(0.5, 1.5))
            if await self._claims.run(self.rescuer.rescue):
                self._notified()  # rescued jobs may be claimable now

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
            if now >= self._next_promote or (self._next_due is not None and now >= self._next_due):
                await self._promote()
            full = False
            if free > 0 and self._maybe_more:
                _, full = await self._claim_round(free)
                self._maybe_more = full
                next_poll = time.monotonic() + poll
            if s.burst and not full and not self._running and await self._burst_done():
                break
            if self._maybe_more and len(self._running) < s.concurrency:
                continue
            await self._sleep(min(next_poll, self._next_wake()) - time.monotonic())

    async def _claim_round(self, free: int) -> tuple[int, bool]:
        """Claim up to `free` jobs across the queues; `full` if some queue may have more."""
        total, full = 0, False
        queues = list(self.settings.queues)
        start = self._rng.randrange(len(queues))
        for queue in queues[start:] + queues[:start]:
            want = min(free - total, self.settings.batch_size)
            if want <= 0:
                break
            jobs, queue_full = await self._claim_queue(queue, want)
            for job in jobs:
                self._start(job)
            total += len(jobs)
            full = full or queue_full
        return total, full

    async def _claim_queue(self, queue: str, want: int) -> tuple[list[ClaimedJob], bool]:
        hint = self._hints[queue]
        if hint is not None and time.monotonic() >= self._hint_deadline[queue]:
            hint = None
        jobs = await self._claim(queue, hint or FLOOR, want)
        last, last_want = jobs, want
        if hint is not None and len(jobs) < want:
            # Short: something may sit below the hint (committed late, promoted, put back).
            hint = None
            last_want = want - len(jobs)
            last = await self._claim(queue, FLOOR, last_want)
            jobs = jobs + last
        if hint is None:
            self._reset_hint_deadline(queue)
        self._hints[queue] = _next_hint(jobs, last, last_want, hint)
        return jobs, len(jobs) == want

    async def _claim(self, queue: str, after: tuple[int, int], limit: int) -> list[ClaimedJob]:
        params = {
            "queue": queue,
            "after_priority": after[0],
            "after_id": after[1],
            "limit": limit,
            "worker_id": self.id,
            "now": None,
        }

        async def claim(conn: Any) -> list[Any]:
            cur = await conn.execute(query("job_claim", self.schema), params)
            rows: list[Any] = await cur.fetchall()
            return rows

        rows = await self._claims.run(claim)
        self.stats.claims += 1
        if after == FLOOR:
            self.stats.unhinted_claims += 1
        self.stats.claimed += len(rows)
        jobs = [ClaimedJob(*row) for row in rows]
        jobs.sort(key=lambda j: (j.priority, j.id))
        return jobs

    def _reset_hint_deadline(self, queue: str) -> None:
        s = self.settings
        spread = self._rng.uniform(1 - s.hint_reset_jitter, 1 + s.hint_reset_jitter)
        self._hint_deadline[queue] = (
            time.monotonic() + s.hint_reset_interval.total_seconds() * spread
        )

    async def _promote(self) -> None:
        """Move due scheduled jobs to queued; remember when the next one falls due."""
        s = self.settings
        params = {"queues": list(s.queues), "limit": s.promote_batch, "now": None}

        async def promote(conn: Any) -> tuple[int, Any]:
            cur = await conn.execute(query("job_promote_due", self.schema), params)
            row = await cur.fetchone()
            return int(row[0]), row[1]

        promoted, next_run_at = await self._claims.run(promote)
        now = time.monotonic()
        self._next_promote = now + s.poll_interval.total_seconds()
        self.stats.promoted += promoted
        if promoted:
            self._maybe_more = True
            if promoted == s.promote_batch:
                self._next_promote = now  # more are due
        self._next_due = None
        if next_run_at is not None:
            wait = (next_run_at - datetime.now(timezone.utc)).total_seconds()
            self._next_due = now + max(wait, 0.0)

    def _next_wake(self) -> float:
        candidates = [self._next_promote]
        if self._next_due is not None:
            candidates.append(self._next_due)
        return min(candidates)

    async def _burst_done(self) -> bool:
        """In burst mode: nothing running, nothing claimable, nothing due to promote."""
        if self._running or not all(lane.idle for lane in self.lanes):
            return False
        await self.completer.flushed()
        retried_before, self._retried_seen = self._retried_seen, self.completer.retried
        promoted_before = self.stats.promoted
        await self._promote()
        if self._retried_seen != retried_before or self.stats.promoted != promoted_before:
            self._maybe_more = True  # retried or promoted jobs may be claimable now
            return False
        return True

    # -- running ----------------------------------------------------------------------------

    def _start(self, job: ClaimedJob) -> None:
        task = asyncio.create_task(self._run(job), name=f"pgqueue-job-{job.id}")
        self._running[task] = job
        task.add_done_callback(self._finished)

    async def _run(self, job: ClaimedJob) -> None:
        try:
            outcome = await self.executor.run(job)
        except asyncio.CancelledError:
            self._unfinished.append(job)
            raise
        self.completer.add(outcome)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        if self._wake is not None:
            self._wake.set()

    # -- waking and stopping ----------------------------------------------------------------

    def _notified(self) -> None:
        self._maybe_more = True
        self._atomic_wake.set()
        if self._wake is not None:
            self._wake.set()

    def _atomic_lanes(self) -> list[AtomicLane]:
        tasks = sorted(t.name for t in self.registry if t.atomic and t.fn is not None)
        if not tasks or self.settings.atomic_concurrency == 0:
            return []
        timeout = max(t.policy.timeout or ATOMIC_MAX_TIMEOUT for t in self.registry if t.atomic)
        return [
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
            )
            for _ in range(self.settings.atomic_concurrency)
        ]

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
        cur = await conn.execute(
            query("job_release_orphans", self.schema), {"worker_id": self.id, "known": known}
        )
        orphans = await cur.fetchall()
        if orphans:
            log.warning("put back %d jobs claimed while the connection broke", len(orphans))

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


def _next_hint(
    jobs: list[ClaimedJob], last: list[ClaimedJob], last_want: int, hint: tuple[int, int] | None
) -> tuple[int, int] | None:
    """Where the next claim of a queue starts.

    After a full batch, claimable jobs may follow right after it: start after its highest.
    After a short batch, nothing claimable was left past anything we took: start after the
    highest of all; and with nothing taken, keep the hint (None after a reset).
    """
    if last and len(last) == last_want:
        return max((j.priority, j.id) for j in last)
    if jobs:
        return max((j.priority, j.id) for j in jobs)
    return hint


def _is_async(registry: Registry, name: str) -> bool:
    try:
        return registry.get(name).is_async
    except Exception:
        return True
