"""The worker: claim -> execute -> complete, with heartbeats and a clean shutdown.

Owns: the loop that claims jobs and runs them, at most `concurrency` at once (`async def`
handlers as tasks on the event loop, `def` handlers in the executor's threads), and the order
of its services (runtime/service.py), started in this order and stopped in reverse: the claim
and completion connections, the worker's registration, the heartbeat, the completer, the
executor, the rescuer, the cancel watch, the horizon watch, the periodic scheduler, the
history partitions' upkeep and the history pruner (each only when there is something for it
to do, never in burst mode), and the notifier (unless poll-only without a listen DSN).
Claims go through the Claimer (claimer.py); atomic jobs through lanes of their own
(atomic.py). Observers (observe.py: the worker's own tally, metrics, traces, JSON logs) hear
of each job's start and outcome and of each claim.

Cancellation of a running job reaches the worker as a notification, with the cancel watch as
the fallback: an async handler is cancelled, a sync one sees `ctx.cancel_requested`; the job
ends as cancelled.

Stopping (SIGTERM/SIGINT, or stop()): claiming stops, running jobs get `shutdown_grace` to
finish, the rest are cancelled and put back as queued without spending an attempt, then the
services stop: outcomes are flushed and the worker row is removed. A second signal skips the
grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from pgqueue.errors import ConfigurationError, DatabaseError, WorkerStateError
from pgqueue.history.partitions import HistoryPartitions
from pgqueue.history.retention import Pruner
from pgqueue.models import (
    ALL_QUEUES,
    ATOMIC_MAX_TIMEOUT,
    ClaimedJob,
    QueueSettings,
    WorkerSettings,
)
from pgqueue.queries import migrations
from pgqueue.registry import CancelSignal, Progress, Registry
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Every, Health, Service, Services
from pgqueue.schedule import Schedules
from pgqueue.store.jobs import JobsStore
from pgqueue.store.migrations import pending_async
from pgqueue.store.plan import AsyncConn, run_async
from pgqueue.store.queues import paused_plan
from pgqueue.store.workers import WorkersStore
from pgqueue.store.workflows import write_progress
from pgqueue.values import tolerate
from pgqueue.wakeup import Position
from pgqueue.worker.atomic import AtomicLane
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.completer import OUTCOME_BATCH, Completer
from pgqueue.worker.executor import Executor, cancelled
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.horizon import HorizonWatch
from pgqueue.worker.interest import WakeInterest
from pgqueue.worker.notifier import Notifier
from pgqueue.worker.observe import JobObserver, Observers, WorkerStats, WorkerTally
from pgqueue.worker.rescuer import Rescuer
from pgqueue.worker.scheduler import Scheduler

log = logging.getLogger("pgqueue.worker")
STRAGGLER_THREADS = 64
# How often running jobs' progress reports are written: at most one row update per job per
# interval, however often the handler reports.
PROGRESS_INTERVAL = timedelta(seconds=1)
STOP_GRACE = 60.0  # seconds each service has to stop: the completer's last writes, mostly


class Application(Protocol):
    """What a worker needs of the application's Queue or AsyncQueue: its tasks, its recurring
    jobs and its settings."""

    registry: Registry
    periodics: Schedules
    settings: QueueSettings


class Worker:
    """Runs the registered tasks of a Queue or AsyncQueue against `dsn`."""

    def __init__(
        self,
        queue: Application,
        *,
        dsn: str,
        settings: WorkerSettings | None = None,
        schema: str | None = None,
        observers: Sequence[JobObserver] = (),
        listen_dsn: str | None = None,
        **overrides: Any,
    ) -> None:
        if not all(hasattr(queue, name) for name in ("registry", "periodics", "settings")):
            raise ConfigurationError(
                f"Worker takes the application's Queue or AsyncQueue, got {type(queue).__name__}"
            )
        self.registry: Registry = queue.registry
        self.periodics: Schedules = queue.periodics
        self.scheduler: Scheduler | None = None  # set at start when it has recurring jobs
        self.pruner: Pruner | None = None  # set at start with history_retention
        self.partitions: HistoryPartitions | None = None  # set at start, except in burst mode
        self.horizon: HorizonWatch | None = None
        self.queue_settings: QueueSettings = queue.settings
        if schema is not None:
            self.queue_settings = self.queue_settings.model_copy(
                update={"schema_name": QueueSettings(schema=schema).schema_name}
            )
        self.schema: str = self.queue_settings.schema_name
        self.jobs = JobsStore(self.schema)
        self.dsn = dsn
        self.settings = settings or WorkerSettings(**overrides)
        # Wake-ups come over a session of their own, on `listen_dsn` when given: a direct
        # connection to PostgreSQL beside claims through PgBouncer's transaction pooling
        # (poll_only), where a LISTEN would hear nothing once its transaction ends.
        self.listen_dsn = listen_dsn or dsn
        self.listening = not self.settings.poll_only or listen_dsn is not None
        if self.settings.queues == (ALL_QUEUES,):
            known = sorted({"default", *(task.options.queue for task in self.registry)})
            self.settings = self.settings.model_copy(update={"queues": tuple(known)})
        self.tally = WorkerTally()
        # Others may join later (metrics.registry_for_worker), and stay for every run.
        self.observers = Observers([self.tally, *observers])
        # Guards the start and stop of a run against a second start or a stop from another
        # thread; reentrant, so a stop() from a signal handler of the same thread cannot block.
        self._state = threading.RLock()
        self._active = False  # between the start of a run and its end
        self._stopping = False  # set: the current run stops, or, between runs, the next one
        self._loop: asyncio.AbstractEventLoop | None = None  # the current run's
        self._fresh_run()

    def _fresh_run(self) -> None:
        """What one run owns, new for each run: a restarted worker registers anew (a new id),
        opens new connections and services, and counts its jobs from zero."""
        self.id = 0
        self.stats = WorkerStats()
        tally = WorkerTally()
        self.observers.all = [tally if seen is self.tally else seen for seen in self.observers.all]
        self.tally = tally
        self.services = Services()
        self.scheduler = None
        self.pruner = None
        self.partitions = None
        self.horizon = None
        self.abandoned_threads = 0
        self._running: dict[asyncio.Task[None], ClaimedJob] = {}
        self._cancels: dict[int, CancelSignal] = {}  # running lease jobs by id
        self._progress: dict[int, tuple[ClaimedJob, Progress]] = {}  # the same jobs' reports
        self._unfinished: list[ClaimedJob] = []
        self._force = False
        self._maybe_more = True
        self._retried_seen = 0
        self._floor_checked = False  # burst mode: an empty claim from the floor since work
        self._wakes = 0  # wake-ups so far: one during a claim means claim again
        self._short_at = time.monotonic()  # when a claim round last found less than it asked
        self.interest: WakeInterest | None = None  # made once registered; never when polling
        self._wake: asyncio.Event | None = None
        self._forced: asyncio.Event | None = None
        self._atomic_wake = asyncio.Event()
        self._atomic_tasks: list[asyncio.Task[None]] = []  # one running each of atomic_lanes
        self.atomic_lanes: list[AtomicLane] = []

    # -- public -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped by SIGTERM/SIGINT (or, with burst, until the queues are empty)."""
        asyncio.run(self.run_async(handle_signals=True))

    async def run_async(self, *, handle_signals: bool = False) -> None:
        """Run until stop() (or, with burst, until the queues are empty).

        A worker runs once at a time: starting it while it runs raises WorkerStateError. Once
        a run has ended (stopped, or failed to start) it can be started again, and that run is
        a new one: a new registration and worker id, new connections and services."""
        with self._state:
            if self._active:
                raise WorkerStateError(
                    f"worker {self.id or '(starting)'} is already running: stop it before "
                    "starting it again, or create another Worker to run more at once"
                )
            self._active = True
            self._fresh_run()
            self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._forced = asyncio.Event()
        loop = self._loop
        try:
            if handle_signals:  # raises outside the main thread: this run ends, not the next
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, self._on_signal, sig)
            await self._serve()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            with self._state:
                self._loop = None
                self._stopping = False
                self._active = False

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop; safe to call from any thread or a signal handler. Called
        while the worker is not running, it stops the next run at once."""
        with self._state:
            loop = self._loop
            if loop is None:
                self._stopping = True
                return
        loop.call_soon_threadsafe(self._request_stop, force)

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
        finish_link = Link(self.dsn, "complete", prepare=prepare, on_connect=self._planner_session)
        self.services = services = Services()
        try:
            await self._start_services(services, finish_link)
            log.info(
                "worker %s started: queues=%s concurrency=%s schema=%s%s",
                self.id,
                ",".join(s.queues),
                s.concurrency,
                self.schema,
                self._mode(),
            )
            self._warn_unserved()
            await self._warn_paused(finish_link)
            # What start-up made (modules, the registry, connections) lives as long as the
            # worker: out of the collector's reach, a full collection no longer walks it,
            # which stalled the loop for tens of milliseconds mid-run (bench enqueue-scale's
            # idle latency). Garbage is collected first, so none of it is kept for good.
            gc.collect()
            gc.freeze()
            await self._fetch_loop()
        finally:
            self._stopping = True  # also after a burst ends: atomic lanes stop with it
            await self._drain(self._atomic_tasks)
            if self.id:
                await self._cancel_unfinished()
                await self._release_unfinished()
            await services.stop(STOP_GRACE)
            log.info(
                "worker %s stopped: %s jobs claimed in %s claims (%s empty), %s put back",
                self.id,
                self.stats.claimed,
                self.stats.claims,
                self.stats.empty_claims,
                len(self._unfinished),
            )

    async def _start_services(self, services: Services, finish_link: Link) -> None:
        """Start the worker's services, each after those it uses; `services` stops them in
        reverse."""
        s = self.settings
        keep_history = self.queue_settings.keep_history
        await services.start(self._claims)
        await services.start(finish_link)
        registration = _Registration(finish_link, self.schema, self._identity())
        await services.start(registration)
        self.id = registration.worker_id
        identity = self._identity() | {"worker_id": self.id}
        await services.start(
            Heartbeat(
                self.dsn,
                self.schema,
                identity,
                s.heartbeat_interval,
                prepare=not s.poll_only,
                on_revived=self._revived,
                report=self.tally.report,
            )
        )
        self.completer = Completer(
            finish_link, self.schema, keep_history, max(s.batch_size, OUTCOME_BATCH)
        )
        await services.start(self.completer)
        # The headroom beyond `concurrency` is for sync jobs that ran past their timeout: they
        # keep their thread, but their slot is free for the next job.
        self.executor = Executor(
            self.registry, s.concurrency + STRAGGLER_THREADS, self.queue_settings.max_payload_bytes
        )
        await services.start(self.executor)
        self.claimer = Claimer(
            self._claims,
            self.schema,
            s,
            self.id,
            self.stats,
            self.observers,
            listening=self.listening,
        )
        if self.listening:
            self.interest = WakeInterest(
                self._claims, self.schema, self.id, self.claimer, s.poll_interval.total_seconds()
            )
        self.rescuer = Rescuer(
            self.registry,
            self.schema,
            s.lease_timeout,
            keep_history,
            link=self._claims,
            interval=s.rescue_interval,
            on_claimable=self._notified,
            queues=s.queues,
        )
        await services.start(self.rescuer)
        await services.start(Every("cancel watch", s.rescue_interval, self._check_cancels))
        await services.start(Every("progress", PROGRESS_INTERVAL, self._write_progress))
        self.horizon = HorizonWatch(self._claims, self.schema, s.rescue_interval, s.horizon_warning)
        await services.start(self.horizon)
        for service in self._maintenance():
            await services.start(service)
        if self.listening:
            await services.start(
                Notifier(
                    self.listen_dsn,
                    self.schema,
                    set(s.queues),
                    self._announced,
                    self._relistened,
                    self._cancel_requested,
                    self._pause_changed,
                    lambda queue: self._controls_changed(),
                )
            )
        self.atomic_lanes = self._make_atomic_lanes()
        self._atomic_tasks = [
            asyncio.create_task(lane.run(), name=f"pgqueue-atomic-{n}")
            for n, lane in enumerate(self.atomic_lanes)
        ]

    def _mode(self) -> str:
        if not self.settings.poll_only:
            return ""
        return " (poll only, listening apart)" if self.listening else " (poll only)"

    def _warn_unserved(self) -> None:
        """Say which of the application's tasks this worker will never run: a task on a queue
        no worker serves waits forever without a word otherwise."""
        served = set(self.settings.queues)
        for task in self.registry:
            if task.fn is not None and task.options.queue not in served:
                log.warning(
                    "task %r runs on queue %r, which this worker does not serve: its jobs wait "
                    "for a worker started with --queues %s (or --queues all)",
                    task.name,
                    task.options.queue,
                    task.options.queue,
                )

    async def _warn_paused(self, link: Link) -> None:
        """Say which of the served queues are paused: their jobs wait until resumed."""
        paused = await link.run(lambda conn: run_async(conn, paused_plan(self.schema)))
        served = set(self.settings.queues)
        for pause in paused:
            if pause.queue in served or ALL_QUEUES in served:
                log.warning(
                    "queue %r is paused (since %s%s): its jobs wait for `pgqueue queues resume %s`",
                    pause.queue,
                    pause.paused_at.isoformat(timespec="seconds"),
                    f", {pause.reason}" if pause.reason else "",
                    pause.queue,
                )

    @property
    def horizon_checks(self) -> int:
        """How many times this worker looked at the horizon (tests wait on it)."""
        return self.horizon.checks if self.horizon is not None else 0

    def _maintenance(self) -> list[Service]:
        """The periodic scheduler, the history partitions' upkeep and the history pruner,
        each on a connection of its own, when this worker has something for them to do
        (never in burst mode)."""
        s = self.settings
        found: list[Service] = []
        prepare = not s.poll_only
        if s.periodic and len(self.periodics) and not s.burst:
            link = Link(self.dsn, "periodic", prepare=prepare)
            self.scheduler = Scheduler(self.periodics, self.schema, self.id, link=link)
            found.append(self.scheduler)
        if not s.burst:
            self.partitions = HistoryPartitions(self.dsn, self.schema, prepare=prepare)
            found.append(self.partitions)
        if s.history_retention is not None and not s.burst:
            link = Link(self.dsn, "prune", prepare=prepare)
            self.pruner = Pruner(
                self.schema, s.history_retention, s.prune_interval, s.prune_batch, link=link
            )
            found.append(self.pruner)
        return found

    async def _claim_session(self, conn: AsyncConn) -> None:
        """The claim connection commits without waiting for its WAL flush, so a job starts
        sooner after a wake-up. Safe for lease claims and
        for everything else this connection writes (promotions, put-backs, rescues, the
        deregistration): a commit lost in a crash leaves the rows as they were, which the
        rescuer, the heartbeat and the next reconnect's orphan release already handle, and the
        completer's synchronous commit flushes the claim's WAL before any outcome is durable.
        Not for the worker's registration nor atomic lanes, whose transaction carries the
        handler's writes (test_worker.py pins which connections have it).
        Not when polling only either: behind PgBouncer's transaction pooling a session setting
        would stay on a server connection that other clients' transactions use next."""
        if not self.settings.poll_only:
            await WorkersStore(self.schema).claim_session(conn)
        await self._planner_session(conn)
        tolerate(conn)  # a job whose row Python cannot read fails alone (values.py)

    async def _planner_session(self, conn: AsyncConn) -> None:
        """The claim and completer connections plan for index access (workers.sql,
        session_prefer_indexes); not when polling only (see _claim_session)."""
        if not self.settings.poll_only:
            await WorkersStore(self.schema).planner_session(conn)

    def _identity(self) -> dict[str, Any]:
        s = self.settings
        return {
            "name": s.name or f"{socket.gethostname()}:{os.getpid()}",
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(s.queues),
            "concurrency": s.concurrency,
        }

    # -- claiming ---------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        s = self.settings
        poll = s.poll_interval.total_seconds()
        next_poll = 0.0
        while not self._stopping:
            free = s.concurrency - len(self._running)
            now = time.monotonic()
            if now >= next_poll or self.claimer.room_due(now):
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
                if not full:
                    self._short_at = time.monotonic()
            elif now >= next_poll:
                # Every slot is busy: the poll is made when one frees (_finished wakes the
                # loop), and sleeping until a poll time already past would spin.
                next_poll = now + poll
            if s.burst and not full and not self._running and await self._burst_done():
                break
            if self._maybe_more and len(self._running) < s.concurrency:
                continue
            if self.interest is not None and await self._ask_for_wakes():
                continue
            wake_at = min(next_poll, self.claimer.next_wake())
            if self.interest is not None and (check := self.interest.next_check()) is not None:
                wake_at = min(wake_at, check)
            await self._sleep(wake_at - time.monotonic())

    async def _ask_for_wakes(self) -> bool:
        """Before sleeping: ask for the wake-ups this worker needs (interest.py); True when
        it should claim first. Idle atomic lanes do not keep a busy worker asking: they poll,
        so an atomic job waits at most a poll interval for one while every slot is busy."""
        assert self.interest is not None
        s = self.settings
        await asyncio.sleep(0)  # the jobs just started run their first step before this
        if self._maybe_more and len(self._running) < s.concurrency:
            return True  # a job ended meanwhile: claim now, as the loop would have
        settled = await self.interest.settle()
        # More may be claimable and every slot was busy when the loop came here: the worker
        # claims as soon as one frees, so it is busy, not waiting, even if a job has ended
        # since (test_hint.py's control caught a worker that widened then).
        busy = (
            s.quiet_after is not None
            and self._maybe_more
            and time.monotonic() - self._short_at >= s.quiet_after.total_seconds()
        )
        skip = {queue: self.claimer.wake_range(queue) if busy else None for queue in s.queues}
        widened = await self.interest.ask(skip)
        if settled or widened:
            self._maybe_more = True
        return (settled or widened) and len(self._running) < s.concurrency

    async def _burst_done(self) -> bool:
        """In burst mode: nothing running, nothing claimable, nothing due to promote.

        "Nothing claimable" is only believed after a claim from the floor came back empty:
        a wake-up naming a job below the hint may still be on its way."""
        if self._running or not all(lane.idle for lane in self.atomic_lanes):
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
        progress = Progress()
        self._progress[job.id] = (job, progress)
        self.observers.job_started(job)
        try:
            outcome = await self.executor.run(job, cancel=cancel, progress=progress)
        except asyncio.CancelledError:
            self._unfinished.append(job)
            raise
        finally:
            del self._cancels[job.id]
            del self._progress[job.id]
        if progress.version > progress.written:
            outcome.progress = progress.report  # written with the outcome
        self.completer.add(outcome)
        self.observers.job_finished(job, outcome)

    async def _write_progress(self) -> None:
        """Write the progress reports made since the last write, one statement for all."""
        rows: list[dict[str, object]] = []
        for job, progress in list(self._progress.values()):
            if progress.version > progress.written:
                progress.written = progress.version
                rows.append(
                    {
                        "id": job.id,
                        "attempt": job.attempt,
                        "worker_id": job.worker_id,
                        "progress": progress.report,
                    }
                )
        if rows:
            await self._claims.run(lambda conn: write_progress(conn, self.schema, rows))

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

        ids = list(self._cancels)
        requested = await self._claims.run(
            lambda conn: self.jobs.cancel_requested(conn, ids, self.id)
        )
        for job_id in requested:
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
        """Listening (again): wake-ups and pause notices sent meanwhile were missed, so claim
        from the floor and read the pauses again."""
        self.claimer.forget_hints()
        self.claimer.reread_controls()
        self._notified()

    def _revived(self) -> None:
        """The heartbeat put back this worker's row, removed as dead (called from its
        thread): the rows saying which wake-ups it wants went with it."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._rows_lost)

    def _rows_lost(self) -> None:
        if self.interest is not None:
            self.interest.lost()
        self._notified()

    def _controls_changed(self) -> None:
        """A served queue's rate limit was set or removed: read the limits again."""
        self.claimer.reread_controls()
        self._notified()

    def _pause_changed(self, queue: str, paused: bool) -> None:
        """A served queue was paused or resumed (claimer.py leaves paused queues out)."""
        self.claimer.pause_changed(queue, paused)
        if not paused:
            self._notified()

    @property
    def paused(self) -> frozenset[str]:
        """The served queues this worker knows to be paused: it claims none of their jobs."""
        claimer: Claimer | None = getattr(self, "claimer", None)  # made when serving starts
        return frozenset(claimer.paused) if claimer is not None else frozenset()

    def _notified(self) -> None:
        self._wakes += 1
        self._maybe_more = True
        self._atomic_wake.set()
        if self._wake is not None:
            self._wake.set()

    def _make_atomic_lanes(self) -> list[AtomicLane]:
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
                    prepare=not self.settings.poll_only,
                    observers=self.observers,
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

    async def _drain(self, lanes: list[asyncio.Task[None]]) -> None:
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

    async def _release_orphans(self, conn: AsyncConn) -> None:
        """Put back jobs a claim took for us but whose reply the broken connection lost."""
        if not self.id:
            return
        known = [job.id for job in self._running.values()] + self.completer.job_ids()
        known += [job.id for job in self.claimer.in_hand]  # claimed this round, not yet started
        orphans = await self.jobs.release_orphans(conn, self.id, known)
        if orphans:
            log.warning("put back %d jobs claimed while the connection broke", len(orphans))
            self.claimer.forget_hints()  # they sit below any hint now
            self._notified()  # and nobody else was told they are back

    async def _cancel_unfinished(self) -> None:
        """Unfinished jobs whose cancellation was requested (and not heard of in time) end as
        cancelled instead of going back to run again; guarded like any outcome."""
        if not self._unfinished:
            return

        async def cancel(conn: AsyncConn) -> list[ClaimedJob]:
            ids = [job.id for job in self._unfinished]
            requested = set(await self.jobs.cancel_requested(conn, ids, self.id))
            jobs = [job for job in self._unfinished if job.id in requested]
            if jobs:
                outcomes = [cancelled(job, None) for job in jobs]
                await self.jobs.finish_many(conn, outcomes, self.queue_settings.keep_history)
            return jobs

        done = await self._claims.run(cancel)
        if done:
            log.info("cancelled %d unfinished jobs whose cancellation was requested", len(done))
            self._unfinished = [job for job in self._unfinished if job not in done]

    async def _release_unfinished(self) -> None:
        if not self._unfinished:
            return
        ids = [job.id for job in self._unfinished]

        await self._claims.run(lambda conn: self.jobs.release_many(conn, ids, self.id))
        log.warning("put %d unfinished jobs back in their queues", len(ids))


class _Registration:
    """The worker's row in the workers table: its id, from its start to its stop.

    Written on a connection whose commits wait for the WAL flush (the completer's): with the
    claim connection's asynchronous commit, a server crash could lose the row and its id, which
    a later worker would then get while this one still heartbeats under it.
    """

    name = "registration"

    def __init__(self, link: Link, schema: str, identity: dict[str, Any]) -> None:
        self.link = link
        self.store = WorkersStore(schema)
        self.identity = identity
        self.worker_id = 0

    async def start(self) -> None:
        """Refuse to start on a schema that is not migrated to this version; then take a
        worker id."""
        schema = self.store.schema
        pending = await self.link.run(lambda conn: pending_async(conn, schema))
        option = "" if schema == "pgqueue" else f" --schema {schema}"
        if pending and len(pending) == len(migrations()):
            raise DatabaseError(
                f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate{option}` first"
            )
        if pending:
            # This pgqueue's statements need them: a worker would fail at its first claim.
            names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
            raise DatabaseError(
                f"schema {schema!r} lacks migrations {names} of this pgqueue version: run "
                f"`pgqueue migrate{option}` first"
            )
        self.worker_id = await self.link.run(lambda conn: self.store.register(conn, self.identity))

    async def stop(self, deadline: float) -> None:
        await self.link.run(lambda conn: self.store.deregister(conn, self.worker_id))

    def health(self) -> Health:
        return Health(self.worker_id > 0, f"worker {self.worker_id}")


def _is_async(registry: Registry, name: str) -> bool:
    try:
        return registry.get(name).is_async
    except Exception:
        return True
