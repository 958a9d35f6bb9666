"""The worker: claim -> execute -> complete, with heartbeats and a clean shutdown.

Owns: the public face of a worker, its runs' start and stop, signals. Each run is an object
of its own (run.py), new at each start, which the worker holds and asks: it makes and starts
the run's services (runtime/service.py) in three steps, and stops them in reverse.
Registering: the claim and completion connections, the worker's registration, the
heartbeat. Running: the completer, the executor, then the claimer,
the wake interest, the jobs in flight (inflight.py) and the fetch loop (loop.py), which
claims jobs and starts them, at most `concurrency` at once. Watching: the rescuer, the cancel
watch, the progress writer, the horizon watch, the periodic scheduler, the history
partitions' upkeep and the history pruner (each only when there is something for it to do,
never in burst mode), the notifier (unless poll-only without a listen DSN), and last the
atomic lanes (atomic.py). The services talk through the run's event bus (events.py), never
calling back into the worker: the notifier, the heartbeat and the rescuer publish; the
claimer (claimer.py), the wake interest (interest.py), the jobs in flight and the fetch loop
subscribe. Observers (observe.py: the worker's own tally, metrics, traces, JSON logs) hear of
each job's start and outcome and of each claim; middleware (middleware.py) runs around each
handler.

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
import gc
import logging
import signal
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from pgqueue.errors import ConfigurationError, WorkerStateError
from pgqueue.hooks import JobMiddleware, JobObserver, WorkerLoad, job_middleware
from pgqueue.models import ALL_QUEUES, QueueSettings, WorkerSettings
from pgqueue.registry import Registry
from pgqueue.schedule import Schedules
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.loop import Stop
from pgqueue.worker.notices import warn_paused, warn_unserved
from pgqueue.worker.observe import Observers, WorkerStats, WorkerTally
from pgqueue.worker.rescuer import Rescuer
from pgqueue.worker.run import Run

log = logging.getLogger("pgqueue.worker")
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
        middleware: Sequence[JobMiddleware] = (),
        listen_dsn: str | None = None,
        **overrides: Any,
    ) -> None:
        """`observers` are told of each job, claim and durable call; `middleware` wraps each
        call of a handler, the first outermost (pgqueue.hooks.JobMiddleware)."""
        if not all(hasattr(queue, name) for name in ("registry", "periodics", "settings")):
            raise ConfigurationError(
                f"Worker takes the application's Queue or AsyncQueue, got {type(queue).__name__}"
            )
        self.registry: Registry = queue.registry
        self.periodics: Schedules = queue.periodics
        self.queue_settings: QueueSettings = queue.settings
        if schema is not None:
            self.queue_settings = self.queue_settings.model_copy(
                update={"schema_name": QueueSettings(schema=schema).schema_name}
            )
        self.schema: str = self.queue_settings.schema_name
        self.dsn = dsn
        self.settings = settings or WorkerSettings(**overrides)
        # Wake-ups come over a session of their own, on `listen_dsn` when given: a direct
        # connection to PostgreSQL beside claims through PgBouncer's transaction pooling
        # (poll_only), where a LISTEN would hear nothing once its transaction ends.
        self.listen_dsn = listen_dsn or dsn
        self.listening = not self.settings.poll_only or listen_dsn is not None
        if self.settings.queues == (ALL_QUEUES,):
            known = tuple(self.registry.queues())
            self.settings = self.settings.model_copy(update={"queues": known})
        self.tally = WorkerTally()
        # Others may join later (add_observer: metrics), and stay for every run.
        self.observers = Observers([self.tally, *observers])
        self.middleware = job_middleware(middleware)
        # Guards the start and stop of a run against a second start or a stop from another
        # thread; reentrant, so a stop() from a signal handler of the same thread cannot block.
        self._state = threading.RLock()
        self._active = False  # between the start of a run and its end
        self._stop = Stop()  # asked: the current run stops, or, between runs, the next one
        self._loop: asyncio.AbstractEventLoop | None = None  # the current run's
        # The current run, or the last once it ended; one never started before the first.
        self.current = self._new_run(None)

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
            self._loop = loop = asyncio.get_running_loop()
            self.current = self._new_run(loop)
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
                self._stop = Stop()
                self._active = False

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop; safe to call from any thread or a signal handler. Called
        while the worker is not running, it stops the next run at once."""
        with self._state:
            loop = self._loop
            if loop is None:
                self._stop.requested = True
                return
        loop.call_soon_threadsafe(self._request_stop, force)

    @property
    def id(self) -> int:
        """This worker's id in the workers table, new for each run; 0 until it registers."""
        return self.current.id

    @property
    def stats(self) -> WorkerStats:
        """The current (or last) run's claims, counted from zero at each start."""
        return self.current.stats

    # -- lifecycle --------------------------------------------------------------------------

    def _new_run(self, loop: asyncio.AbstractEventLoop | None) -> Run:
        """A run to start on `loop`, counting its jobs from zero: its tally takes the last
        one's place among the observers."""
        tally = WorkerTally()
        self.observers.all = [tally if seen is self.tally else seen for seen in self.observers.all]
        self.tally = tally
        return Run(
            registry=self.registry,
            periodics=self.periodics,
            queue_settings=self.queue_settings,
            settings=self.settings,
            dsn=self.dsn,
            listen_dsn=self.listen_dsn if self.listening else None,
            observers=self.observers,
            middleware=self.middleware,
            tally=tally,
            stop=self._stop,
            loop=loop,
        )

    async def _serve(self) -> None:
        s = self.settings
        run = self.current
        try:
            fetch = await run.start()
            log.info(
                "worker %s started: queues=%s concurrency=%s schema=%s%s",
                run.id,
                ",".join(s.queues),
                s.concurrency,
                self.schema,
                self._mode(),
            )
            warn_unserved(self.registry, s.queues)
            await warn_paused(run.finish_link, self.schema, s.queues)
            # What start-up made (modules, the registry, connections) lives as long as the
            # worker: out of the collector's reach, a full collection no longer walks it,
            # which stalled the loop for tens of milliseconds mid-run (bench enqueue-scale's
            # idle latency). Garbage is collected first, so none of it is kept for good.
            gc.collect()
            gc.freeze()
            await fetch.run()
        finally:
            await run.end(STOP_GRACE)
            log.info(
                "worker %s stopped: %s jobs claimed in %s claims (%s empty), %s put back",
                run.id,
                run.stats.claimed,
                run.stats.claims,
                run.stats.empty_claims,
                len(run.inflight.unfinished) if run.inflight is not None else 0,
            )

    def _mode(self) -> str:
        if not self.settings.poll_only:
            return ""
        return " (poll only, listening apart)" if self.listening else " (poll only)"

    def add_observer(self, observer: JobObserver) -> None:
        """Tell `observer` of this worker's jobs from now on, for every run (metrics join
        this way)."""
        self.observers.all.append(observer)

    def load(self) -> WorkerLoad:
        """What this worker holds now: jobs running, slots free, jobs of dead workers it
        rescued. Cheap: read at each metrics scrape."""
        run = self.current
        lease_jobs = len(run.inflight.running) if run.inflight is not None else 0
        running = lease_jobs + sum(not lane.idle for lane in run.atomic_lanes)
        rescuer: Rescuer | None = getattr(run, "rescuer", None)  # made when serving starts
        return WorkerLoad(
            running=running,
            free_slots=max(self.settings.concurrency - lease_jobs, 0),
            rescued=rescuer.rescued if rescuer is not None else 0,
        )

    @property
    def horizon_checks(self) -> int:
        """How many times this worker looked at the horizon (tests wait on it)."""
        horizon = self.current.horizon
        return horizon.checks if horizon is not None else 0

    @property
    def paused(self) -> frozenset[str]:
        """The served queues this worker knows to be paused: it claims none of their jobs."""
        claimer: Claimer | None = getattr(self.current, "claimer", None)  # made when serving starts
        return frozenset(claimer.controls.paused) if claimer is not None else frozenset()

    # -- stopping ---------------------------------------------------------------------------

    def _on_signal(self, sig: signal.Signals) -> None:
        force = self._stop.requested
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
        self._stop.request(force)
        if self.current.fetch_loop is not None:
            self.current.fetch_loop.wake()

    @property
    def abandoned_threads(self) -> int:
        """How many sync handlers the last stop left running in their threads (their jobs
        were put back): a process that exits should not wait for them."""
        inflight = self.current.inflight
        return inflight.abandoned_threads if inflight is not None else 0
