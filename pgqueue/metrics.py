"""Prometheus metrics: a worker's own counters and histograms, and the database's gauges.

Owns: the metric names (the README lists each), WorkerMetrics (an observer a worker tells of
each job and claim), and the collectors read at scrape time: WorkerCollector (running jobs,
free slots and rescues of one worker) and DatabaseCollector (queue depth, oldest queued job,
the horizon's age, workers and outbox), which `pgqueue worker --metrics-port` and the
dashboard's /metrics both serve.

Invariants: the gauges are read when Prometheus scrapes, from the hot jobs table and the
server's activity view, never from history, so a scrape costs the same however much history
is kept. Names and labels are stable: a rename breaks users' dashboards and alerts.

Fails: a database error during a scrape is logged and reported as `pgqueue_database_up 0`,
with the other database gauges left out; the scrape itself still answers. Needs the
`metrics` extra (prometheus_client); the core never imports this module.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pgqueue import health
from pgqueue.errors import DatabaseError
from pgqueue.models import ClaimedJob
from pgqueue.observe import outcome_name
from pgqueue.store.workers import WorkersStore

if TYPE_CHECKING:
    from pgqueue.executor import Outcome
    from pgqueue.worker import Worker

log = logging.getLogger("pgqueue.metrics")

# Job run times span milliseconds to hours; claims, fractions of a millisecond to seconds.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class WorkerMetrics:
    """The counters and histograms of one worker's jobs and claims, in `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.finished = Counter(
            "pgqueue_jobs_finished",
            "Job attempts ended by this worker, by outcome: succeeded, failed, retried, "
            "snoozed or cancelled.",
            ["queue", "task", "outcome"],
            registry=registry,
        )
        self.run_seconds = Histogram(
            "pgqueue_job_run_seconds",
            "Time an attempt's handler ran.",
            ["queue", "task"],
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.wait_seconds = Histogram(
            "pgqueue_job_wait_seconds",
            "Time from when a job was due to its attempt's start: its wait in the queue.",
            ["queue"],
            buckets=RUN_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "pgqueue_job_retries",
            "Failed attempts that will be retried.",
            ["queue", "task"],
            registry=registry,
        )
        self.claims = Counter(
            "pgqueue_claims",
            "Claim statements run, by whether they returned jobs.",
            ["result"],
            registry=registry,
        )
        self.jobs_claimed = Counter(
            "pgqueue_jobs_claimed", "Jobs claimed by this worker.", registry=registry
        )
        self.claim_seconds = Histogram(
            "pgqueue_claim_seconds",
            "Time a claim statement took, round trip.",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self._claims_with_jobs = self.claims.labels("jobs")
        self._claims_empty = self.claims.labels("empty")
        # Each series' child, looked up once: labels() takes a lock and builds a key.
        self._children: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        self._waits: dict[str, Any] = {}

    def job_started(self, job: ClaimedJob) -> None:
        if job.waited is not None:
            waits = self._waits.get(job.queue)
            if waits is None:
                waits = self._waits[job.queue] = self.wait_seconds.labels(job.queue)
            waits.observe(max(job.waited, 0.0))

    def job_finished(self, job: ClaimedJob, outcome: Outcome) -> None:
        name = outcome_name(outcome)
        key = (job.queue, job.task, name)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.finished.labels(*key),
                self.run_seconds.labels(job.queue, job.task),
                self.retries.labels(job.queue, job.task),
            )
        finished, run_seconds, retries = children
        finished.inc()
        if outcome.duration is not None:
            run_seconds.observe(outcome.duration)
        if name == "retried":
            retries.inc()

    def claimed(self, seconds: float, jobs: int) -> None:
        self.claim_seconds.observe(seconds)
        if jobs:
            self._claims_with_jobs.inc()
            self.jobs_claimed.inc(jobs)
        else:
            self._claims_empty.inc()


class WorkerCollector(Collector):
    """What one worker holds now, read at scrape time."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        running = len(w._running) + sum(not lane.idle for lane in w.lanes)
        yield GaugeMetricFamily(
            "pgqueue_worker_jobs_running", "Jobs this worker runs now.", running
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_free_slots",
            "Jobs this worker could start now (its concurrency less those running).",
            max(w.settings.concurrency - len(w._running), 0),
        )
        rescuer = getattr(w, "rescuer", None)
        yield CounterMetricFamily(
            "pgqueue_jobs_rescued",
            "Jobs of dead workers that this worker put back or failed.",
            rescuer.rescued if rescuer is not None else 0,
        )


class DatabaseCollector(Collector):
    """The queues, workers, outbox and horizon as the database sees them, read at scrape time
    on one connection of its own (opened on first scrape, opened again after an error)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            try:
                families = self._read()
            except (psycopg.Error, DatabaseError) as exc:
                log.warning("metrics: could not read the database: %s", exc)
                self.close()
                families = []
        yield GaugeMetricFamily(
            "pgqueue_database_up",
            "Whether the last scrape could read the database.",
            1 if families else 0,
        )
        yield from families

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _read(self) -> list[Metric]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, application_name="pgqueue:metrics"
            )
        conn = self._conn
        jobs = GaugeMetricFamily(
            "pgqueue_queue_jobs", "Live jobs by queue and status.", labels=["queue", "status"]
        )
        oldest = GaugeMetricFamily(
            "pgqueue_queue_oldest_job_age_seconds",
            "How long the oldest queued (due, unclaimed) job of each queue has waited.",
            labels=["queue"],
        )
        for row in health.queue_depth(conn, self.schema):
            jobs.add_metric([row.queue, row.status], row.jobs)
            if row.oldest_queued_seconds is not None:
                oldest.add_metric([row.queue], max(row.oldest_queued_seconds, 0.0))
        holders = [h for h in health.horizon_holders(conn) if h.age is not None]
        horizon = GaugeMetricFamily(
            "pgqueue_horizon_age_seconds",
            "Age of the oldest transaction holding back VACUUM in this database (0: none).",
            max((h.age.total_seconds() for h in holders if h.age is not None), default=0.0),
        )
        workers = WorkersStore(self.schema).list(conn)
        alive = GaugeMetricFamily(
            "pgqueue_workers", "Workers with a row (alive or not yet rescued).", len(workers)
        )
        running = GaugeMetricFamily(
            "pgqueue_jobs_running", "Jobs running on all workers.", sum(w.running for w in workers)
        )
        free = GaugeMetricFamily(
            "pgqueue_free_slots",
            "Jobs all workers could start now (their concurrency less those running).",
            sum(max(w.concurrency - w.running, 0) for w in workers),
        )
        outbox = health.outbox_stats(conn, self.schema)
        staged = GaugeMetricFamily(
            "pgqueue_outbox_messages",
            "Messages in the outbox, staged or dead.",
            labels=["state"],
        )
        staged.add_metric(["staged"], outbox.staged)
        staged.add_metric(["dead"], outbox.dead)
        return [jobs, oldest, horizon, alive, running, free, staged]


def registry_for_worker(worker: Worker, dsn: str) -> CollectorRegistry:
    """A registry with `worker`'s metrics, its collector and the database's, and the worker
    told of its jobs."""
    registry = CollectorRegistry()
    worker.observers.all.append(WorkerMetrics(registry))
    registry.register(WorkerCollector(worker))
    registry.register(DatabaseCollector(dsn, worker.schema))
    return registry


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> None:
    """Serve `registry` at http://addr:port/metrics from a thread of its own."""
    start_http_server(port, addr=addr, registry=registry)
