"""The wiring of one run of a worker (pgqueue/worker/worker.py): what the run owns, new for
each run, and its services made and started in three steps, in the order the worker's
docstring gives. `Worker` is made of this and its public face: its settings, its runs'
start and stop, signals.

Invariant: each service starts after those it uses, and `services` stops them in reverse; a
start that fails leaves the run with what it started, which the worker stops.
"""

from __future__ import annotations

from datetime import timedelta

from pgqueue.history.partitions import HistoryPartitions
from pgqueue.history.retention import Pruner
from pgqueue.hooks import JobMiddleware
from pgqueue.models import QueueSettings, WorkerSettings
from pgqueue.registry import Registry
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Every, Service, Services
from pgqueue.schedule import Schedules
from pgqueue.store.jobs import JobsStore
from pgqueue.worker.atomic import AtomicLane, make_lanes
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.completer import OUTCOME_BATCH, Completer
from pgqueue.worker.declarations import sync_declarations
from pgqueue.worker.events import Bus
from pgqueue.worker.executor import Executor
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.horizon import HorizonWatch
from pgqueue.worker.inflight import InFlight
from pgqueue.worker.interest import WakeInterest
from pgqueue.worker.loop import FetchLoop, Stop
from pgqueue.worker.notifier import Notifier
from pgqueue.worker.observe import Observers, WorkerStats, WorkerTally
from pgqueue.worker.registration import Registration, identity
from pgqueue.worker.rescuer import Rescuer
from pgqueue.worker.scheduler import Scheduler

STRAGGLER_THREADS = 64
# How often running jobs' progress reports are written: at most one row update per job per
# interval, however often the handler reports.
PROGRESS_INTERVAL = timedelta(seconds=1)


class Wiring:
    """One run's parts and their start; the worker's configuration is read, never changed."""

    # The worker's configuration, set once by Worker.__init__.
    registry: Registry
    periodics: Schedules
    queue_settings: QueueSettings
    schema: str
    jobs: JobsStore
    dsn: str
    settings: WorkerSettings
    listen_dsn: str
    listening: bool
    tally: WorkerTally
    observers: Observers
    middleware: tuple[JobMiddleware, ...]
    _stop: Stop
    # The run's own, made as it starts.
    _claims: Link
    completer: Completer
    executor: Executor
    claimer: Claimer
    rescuer: Rescuer
    scheduler: Scheduler | None  # when it has recurring jobs
    pruner: Pruner | None  # with history_retention
    partitions: HistoryPartitions | None  # except in burst mode
    horizon: HorizonWatch | None

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
        self.events: Bus | None = None  # what the run's services tell each other (events.py)
        self.fetch_loop: FetchLoop | None = None  # made once the services it uses have started
        self.inflight: InFlight | None = None  # made with the fetch loop
        self.interest: WakeInterest | None = None  # made once registered; never when polling
        self.atomic_lanes: list[AtomicLane] = []

    async def _start_services(self, services: Services, finish_link: Link) -> FetchLoop:
        """Start the worker's services in the three steps the module's docstring gives, each
        after those it uses (`services` stops them in reverse), and make the fetch loop. The
        services publish what they see on the run's bus; the claimer, the wake interest, the
        jobs in flight and the loop subscribe to it."""
        await self._register(services, finish_link)
        fetch = await self._start_running(services, finish_link)
        await self._start_watches(services, fetch)
        return fetch

    async def _register(self, services: Services, finish_link: Link) -> None:
        """The connections, the tasks' declarations, the worker's row and its heartbeat."""
        s = self.settings
        assert self.events is not None
        await services.start(self._claims)
        await services.start(finish_link)
        # Before the worker's row: whoever sees the worker registered sees its declarations.
        await sync_declarations(finish_link, self.schema, self.registry)
        registration = Registration(finish_link, self.schema, identity(s), session=not s.poll_only)
        await services.start(registration)
        self.id = registration.worker_id
        await services.start(
            Heartbeat(
                self.dsn,
                self.schema,
                identity(s),
                self.id,
                s.heartbeat_interval,
                prepare=not s.poll_only,
                session=not s.poll_only,  # a pooled session is not the worker's own
                events=self.events,
                report=self.tally.report,
            )
        )

    async def _start_running(self, services: Services, finish_link: Link) -> FetchLoop:
        """The completer and the executor, then what claims and runs jobs: the claimer, the
        wake interest, the jobs in flight and the fetch loop."""
        s = self.settings
        events = self.events
        assert events is not None
        self.completer = Completer(
            finish_link,
            self.schema,
            self.queue_settings.keep_history,
            max(s.batch_size, OUTCOME_BATCH),
        )
        await services.start(self.completer)
        # The headroom beyond `concurrency` is for sync jobs that ran past their timeout: they
        # keep their thread, but their slot is free for the next job.
        self.executor = Executor(
            self.registry,
            s.concurrency + STRAGGLER_THREADS,
            self.queue_settings.max_payload_bytes,
            dsn=self.dsn,
            schema=self.schema,
            prepare=not s.poll_only,
            observers=self.observers,
            middleware=self.middleware,
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
        self.claimer.subscribe(events)
        if self.listening:
            self.interest = WakeInterest(
                self._claims, self.schema, self.id, self.claimer, s.poll_interval.total_seconds()
            )
            self.interest.subscribe(events)
        self.inflight = InFlight(
            registry=self.registry,
            worker_id=self.id,
            link=self._claims,
            jobs=self.jobs,
            completer=self.completer,
            executor=self.executor,
            observers=self.observers,
        )
        self.inflight.subscribe(events)
        self.fetch_loop = fetch = FetchLoop(
            settings=s,
            worker_id=self.id,
            jobs=self.jobs,
            claimer=self.claimer,
            interest=self.interest,
            completer=self.completer,
            inflight=self.inflight,
            events=events,
            stop=self._stop,
        )
        # Jobs a claim took but whose reply a broken connection lost: only the loop knows
        # which jobs are this worker's, and none were claimed before it was made.
        self._claims.on_reconnect = fetch.release_orphans
        return fetch

    async def _start_watches(self, services: Services, fetch: FetchLoop) -> None:
        """What watches the jobs and the database: the rescuer, the cancel watch, the progress
        writer, the horizon watch, the maintenance, the notifier; last the atomic lanes."""
        s = self.settings
        assert self.events is not None and self.inflight is not None
        keep_history = self.queue_settings.keep_history
        self.rescuer = Rescuer(
            self.registry,
            self.schema,
            s.lease_timeout,
            keep_history,
            link=self._claims,
            interval=s.rescue_interval,
            events=self.events,
            queues=s.queues,
            worker_id=self.id,
        )
        await services.start(self.rescuer)
        inflight = self.inflight
        await services.start(Every("cancel watch", s.rescue_interval, inflight.check_cancels))
        await services.start(Every("progress", PROGRESS_INTERVAL, inflight.write_progress))
        self.horizon = HorizonWatch(self._claims, self.schema, s.rescue_interval, s.horizon_warning)
        await services.start(self.horizon)
        for service in self._maintenance():
            await services.start(service)
        if self.listening:
            await services.start(Notifier(self.listen_dsn, self.schema, set(s.queues), self.events))
        stop = self._stop
        self.atomic_lanes = make_lanes(
            self.registry,
            s,
            dsn=self.dsn,
            schema=self.schema,
            executor=self.executor,
            keep_history=keep_history,
            worker_id=self.id,
            stopping=lambda: stop.requested,
            wait=fetch.atomic_idle,
            done=fetch.notified,
            observers=self.observers,
        )
        fetch.start_atomic(self.atomic_lanes)

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
