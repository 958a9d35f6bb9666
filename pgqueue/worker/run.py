"""One run of a worker (pgqueue/worker/worker.py): what the run owns, new for each run, and
its services, made and started in three steps in the order the worker's docstring gives. The
worker holds its current run and asks it; a run reads the worker's configuration, given when
it is made, and never calls back into the worker.

Invariant: each service starts after those it uses, and `services` stops them in reverse; a
start that fails leaves the run with what it started, which end() stops.
"""

from __future__ import annotations

import asyncio
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
from pgqueue.worker.sessions import Sessions

STRAGGLER_THREADS = 64
# How often running jobs' progress reports are written: at most one row update per job per
# interval, however often the handler reports.
PROGRESS_INTERVAL = timedelta(seconds=1)


class Run:
    """One run's parts, its start and its end. A run starts once: a restarted worker makes a
    new one, so it registers anew (a new id), opens new connections and services, and counts
    its jobs from zero."""

    # Made as the run starts, each by the step that starts it.
    completer: Completer
    executor: Executor
    claimer: Claimer
    rescuer: Rescuer

    def __init__(
        self,
        *,
        registry: Registry,
        periodics: Schedules,
        queue_settings: QueueSettings,
        settings: WorkerSettings,
        dsn: str,
        listen_dsn: str | None,
        observers: Observers,
        middleware: tuple[JobMiddleware, ...],
        tally: WorkerTally,
        stop: Stop,
        loop: asyncio.AbstractEventLoop | None,
    ) -> None:
        """The worker's configuration, read and never changed; `listen_dsn` is None when the
        run does not listen; `loop` is the one the run will start on (None: it never will)."""
        self.registry = registry
        self.periodics = periodics
        self.queue_settings = queue_settings
        self.schema = queue_settings.schema_name
        self.jobs = JobsStore(self.schema)
        self.settings = settings
        self.dsn = dsn
        self.listen_dsn = listen_dsn
        self.observers = observers
        self.middleware = middleware
        self.tally = tally
        self._stop = stop
        self.id = 0
        self.stats = WorkerStats()
        self.services = Services()
        sessions = Sessions(self.schema, poll_only=settings.poll_only)
        prepare = not settings.poll_only
        self.claim_link = Link(dsn, "claim", prepare=prepare, on_connect=sessions.claim)
        self.finish_link = Link(dsn, "complete", prepare=prepare, on_connect=sessions.planner)
        # What the run's services tell each other (events.py).
        self.events: Bus | None = Bus(loop) if loop is not None else None
        self.scheduler: Scheduler | None = None  # when it has recurring jobs
        self.pruner: Pruner | None = None  # with history_retention
        self.partitions: HistoryPartitions | None = None  # except in burst mode
        self.horizon: HorizonWatch | None = None
        self.fetch_loop: FetchLoop | None = None  # made once the services it uses have started
        self.inflight: InFlight | None = None  # made with the fetch loop
        self.interest: WakeInterest | None = None  # made once registered; never when polling
        self.atomic_lanes: list[AtomicLane] = []

    async def start(self) -> FetchLoop:
        """Start the run's services in the three steps the worker's docstring gives, each
        after those it uses (`services` stops them in reverse), and make the fetch loop. The
        services publish what they see on the run's bus; the claimer, the wake interest, the
        jobs in flight and the loop subscribe to it."""
        await self._register()
        fetch = await self._start_running()
        await self._start_watches(fetch)
        return fetch

    async def end(self, grace: float) -> None:
        """End the run, also one whose start failed part way: claiming stops, running jobs get
        the shutdown grace, the unfinished are put back, then the services stop in reverse,
        each within `grace` seconds."""
        self._stop.requested = True  # also after a burst ends: atomic lanes stop with it
        if self.fetch_loop is not None:
            await self.fetch_loop.drain()
        if self.inflight is not None:
            await self.inflight.put_back_unfinished()
        await self.services.stop(grace)

    async def _register(self) -> None:
        """The connections, the tasks' declarations, the worker's row and its heartbeat."""
        s = self.settings
        assert self.events is not None
        await self.services.start(self.claim_link)
        await self.services.start(self.finish_link)
        # Before the worker's row: whoever sees the worker registered sees its declarations.
        await sync_declarations(self.finish_link, self.schema, self.registry)
        registration = Registration(
            self.finish_link, self.schema, identity(s), session=not s.poll_only
        )
        await self.services.start(registration)
        self.id = registration.worker_id
        await self.services.start(
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

    async def _start_running(self) -> FetchLoop:
        """The completer and the executor, then what claims and runs jobs: the claimer, the
        wake interest, the jobs in flight and the fetch loop."""
        s = self.settings
        events = self.events
        assert events is not None
        self.completer = Completer(
            self.finish_link,
            self.schema,
            self.queue_settings.keep_history,
            max(s.batch_size, OUTCOME_BATCH),
        )
        await self.services.start(self.completer)
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
        await self.services.start(self.executor)
        self.claimer = Claimer(
            self.claim_link,
            self.schema,
            s,
            self.id,
            self.stats,
            self.observers,
            listening=self.listen_dsn is not None,
        )
        self.claimer.subscribe(events)
        if self.listen_dsn is not None:
            self.interest = WakeInterest(
                self.claim_link, self.schema, self.id, self.claimer, s.poll_interval.total_seconds()
            )
            self.interest.subscribe(events)
        self.inflight = InFlight(
            registry=self.registry,
            worker_id=self.id,
            link=self.claim_link,
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
        self.claim_link.on_reconnect = fetch.release_orphans
        return fetch

    async def _start_watches(self, fetch: FetchLoop) -> None:
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
            link=self.claim_link,
            interval=s.rescue_interval,
            events=self.events,
            queues=s.queues,
            worker_id=self.id,
        )
        await self.services.start(self.rescuer)
        inflight = self.inflight
        await self.services.start(Every("cancel watch", s.rescue_interval, inflight.check_cancels))
        await self.services.start(Every("progress", PROGRESS_INTERVAL, inflight.write_progress))
        self.horizon = HorizonWatch(
            self.claim_link, self.schema, s.rescue_interval, s.horizon_warning
        )
        await self.services.start(self.horizon)
        for service in self._maintenance():
            await self.services.start(service)
        if self.listen_dsn is not None:
            notifier = Notifier(self.listen_dsn, self.schema, set(s.queues), self.events)
            await self.services.start(notifier)
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
