"""Prometheus metrics: a worker's own counters and histograms, and the database's gauges.

Owns: the metric names (the README lists each), WorkerMetrics (an observer a worker tells of
each job, claim and durable call, which counts in plain Python and builds its series only
when scraped: prometheus_client's own counters cost a job several times more), and the
collectors read at scrape time: WorkerCollector (running jobs, free slots and rescues of one
worker) and DatabaseCollector (queue depth, with the jobs asleep or parked for a signal,
oldest queued job, the horizon's age, workers, outbox, and per tenant key its running and
waiting jobs and limit, and per fairness key its share of starts against the share owed),
which `pgqueue worker --metrics-port` and the dashboard's /metrics both serve.

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
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pgqueue import health
from pgqueue.errors import DatabaseError
from pgqueue.hooks import AttemptOutcome, ObservedWorker, StepEvent, outcome_name
from pgqueue.models import ClaimedJob
from pgqueue.store import concurrency, fairness
from pgqueue.store.plan import run
from pgqueue.store.workers import WorkersStore

log = logging.getLogger("pgqueue.metrics")

# Job run times span milliseconds to hours; claims, fractions of a millisecond to seconds.
RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600)
CLAIM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class _Histogram:
    """Observations in fixed buckets: an index found by bisection and two additions, where
    prometheus_client's Histogram walks its buckets and takes a lock for each count."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            found.append((bound, running))
        return found


class WorkerMetrics(Collector):
    """The counters and histograms of one worker's jobs and claims: an observer of the
    worker, and a collector Prometheus reads. Counting costs a job a lock and a few
    additions; the series are built only when scraped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: dict[tuple[str, str, str], int] = {}
        self.retries: dict[tuple[str, str], int] = {}
        self.run_seconds: dict[tuple[str, str], _Histogram] = {}
        self.wait_seconds: dict[str, _Histogram] = {}
        self.claims = {"jobs": 0, "empty": 0}
        self.jobs_claimed = 0
        self.claim_seconds = _Histogram(CLAIM_BUCKETS)
        self.durable: dict[tuple[str, str, str], int] = {}  # (counter, queue, task)

    def job_started(self, job: ClaimedJob) -> None:
        if job.waited is None:
            return
        with self._lock:
            waits = self.wait_seconds.get(job.queue)
            if waits is None:
                waits = self.wait_seconds[job.queue] = _Histogram(RUN_BUCKETS)
            waits.observe(max(job.waited, 0.0))

    def job_finished(self, job: ClaimedJob, outcome: AttemptOutcome) -> None:
        name = outcome_name(outcome)
        task = (job.queue, job.task)
        with self._lock:
            key = (job.queue, job.task, name)
            self.finished[key] = self.finished.get(key, 0) + 1
            if outcome.duration is not None:
                runs = self.run_seconds.get(task)
                if runs is None:
                    runs = self.run_seconds[task] = _Histogram(RUN_BUCKETS)
                runs.observe(outcome.duration)
            if name == "retried":
                self.retries[task] = self.retries.get(task, 0) + 1

    def step_event(self, event: StepEvent) -> None:
        counter = _DURABLE_COUNTED.get((event.kind, event.what)) or _DURABLE_COUNTED.get(
            ("*", event.what)
        )
        if counter is None:
            return
        key = (counter, event.job.queue, event.job.task)
        with self._lock:
            self.durable[key] = self.durable.get(key, 0) + 1

    def claimed(self, seconds: float, jobs: int) -> None:
        with self._lock:
            self.claim_seconds.observe(seconds)
            self.claims["jobs" if jobs else "empty"] += 1
            self.jobs_claimed += jobs

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            finished, retries = dict(self.finished), dict(self.retries)
            runs = {k: (h.cumulative(), h.total) for k, h in self.run_seconds.items()}
            waits = {k: (h.cumulative(), h.total) for k, h in self.wait_seconds.items()}
            claims, claimed = dict(self.claims), self.jobs_claimed
            claim_times = (self.claim_seconds.cumulative(), self.claim_seconds.total)
            durable = dict(self.durable)
        family = CounterMetricFamily(
            "pgqueue_jobs_finished",
            "Job attempts ended by this worker, by outcome: succeeded, failed, retried, "
            "snoozed or cancelled.",
            labels=["queue", "task", "outcome"],
        )
        for labels, count in finished.items():
            family.add_metric(list(labels), count)
        yield family
        retry_family = CounterMetricFamily(
            "pgqueue_job_retries", "Failed attempts that will be retried.", labels=["queue", "task"]
        )
        for pair, count in retries.items():
            retry_family.add_metric(list(pair), count)
        yield retry_family
        histogram = HistogramMetricFamily(
            "pgqueue_job_run_seconds", "Time an attempt's handler ran.", labels=["queue", "task"]
        )
        for pair, (buckets, total) in runs.items():
            histogram.add_metric(list(pair), buckets, total)
        yield histogram
        histogram = HistogramMetricFamily(
            "pgqueue_job_wait_seconds",
            "Time from when a job was due to its attempt's start: its wait in the queue.",
            labels=["queue"],
        )
        for queue, (buckets, total) in waits.items():
            histogram.add_metric([queue], buckets, total)
        yield histogram
        family = CounterMetricFamily(
            "pgqueue_claims",
            "Claim statements run, by whether they returned jobs.",
            labels=["result"],
        )
        for result, count in claims.items():
            family.add_metric([result], count)
        yield family
        yield CounterMetricFamily("pgqueue_jobs_claimed", "Jobs claimed by this worker.", claimed)
        histogram = HistogramMetricFamily(
            "pgqueue_claim_seconds", "Time a claim statement took, round trip."
        )
        histogram.add_metric([], *claim_times)
        yield histogram
        yield from self._durable(durable)

    @staticmethod
    def _durable(counts: dict[tuple[str, str, str], int]) -> Iterator[Metric]:
        families = (
            CounterMetricFamily(
                "pgqueue_steps_recorded",
                "Steps (ctx.step) that ran and recorded their result.",
                labels=["queue", "task"],
            ),
            CounterMetricFamily(
                "pgqueue_steps_replayed",
                "Recorded steps, sleeps and waits that a run of their job replayed without "
                "running them again.",
                labels=["queue", "task"],
            ),
            CounterMetricFamily(
                "pgqueue_sleeps", "Durable sleeps (ctx.sleep) that began.", labels=["queue", "task"]
            ),
            CounterMetricFamily(
                "pgqueue_signal_waits",
                "Times a job parked to wait for a signal (ctx.wait_for_signal).",
                labels=["queue", "task"],
            ),
            CounterMetricFamily(
                "pgqueue_signals_delivered", "Signals a waiting job took.", labels=["queue", "task"]
            ),
            CounterMetricFamily(
                "pgqueue_signal_timeouts",
                "Waits for a signal whose timeout passed first.",
                labels=["queue", "task"],
            ),
            CounterMetricFamily(
                "pgqueue_step_mismatches",
                "Runs that found another durable call recorded in a call's place "
                "(StepMismatchError: the job fails).",
                labels=["queue", "task"],
            ),
        )
        for family in families:
            for (counter, queue, task), count in counts.items():
                if counter == family.name:
                    family.add_metric([queue, task], count)
            yield family


# The durable-call counters (pgqueue/worker/durable.py), each told by a (kind, what) pair of a
# StepEvent ("*": any kind).
_DURABLE_COUNTED = {
    ("step", "recorded"): "pgqueue_steps_recorded",
    ("*", "replayed"): "pgqueue_steps_replayed",
    ("sleep", "recorded"): "pgqueue_sleeps",
    ("signal", "parked"): "pgqueue_signal_waits",
    ("signal", "recorded"): "pgqueue_signals_delivered",
    ("signal", "timed out"): "pgqueue_signal_timeouts",
    ("*", "mismatch"): "pgqueue_step_mismatches",
}


class WorkerCollector(Collector):
    """What one worker holds now, read at scrape time."""

    def __init__(self, worker: ObservedWorker) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        load = self.worker.load()
        yield GaugeMetricFamily(
            "pgqueue_worker_jobs_running", "Jobs this worker runs now.", load.running
        )
        yield GaugeMetricFamily(
            "pgqueue_worker_free_slots",
            "Jobs this worker could start now (its concurrency less those running).",
            load.free_slots,
        )
        yield CounterMetricFamily(
            "pgqueue_jobs_rescued",
            "Jobs of dead workers that this worker put back or failed.",
            load.rescued,
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
        sleeping = GaugeMetricFamily(
            "pgqueue_queue_jobs_sleeping",
            "Scheduled jobs of each queue asleep in a durable sleep (ctx.sleep).",
            labels=["queue"],
        )
        parked = GaugeMetricFamily(
            "pgqueue_queue_jobs_waiting_for_signal",
            "Scheduled jobs of each queue parked until a signal (ctx.wait_for_signal).",
            labels=["queue"],
        )
        for row in health.queue_depth(conn, self.schema):
            jobs.add_metric([row.queue, row.status], row.jobs)
            if row.status == "scheduled":
                sleeping.add_metric([row.queue], row.sleeping)
                parked.add_metric([row.queue], row.waiting_for_signal)
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
        return [
            jobs,
            oldest,
            sleeping,
            parked,
            horizon,
            alive,
            running,
            free,
            staged,
            *tenant_metrics(conn, self.schema),
        ]


SHARE_WINDOW_SECONDS = 300.0  # the window fair shares are measured over


def tenant_metrics(conn: psycopg.Connection[Any], schema: str) -> list[Metric]:
    """Per limit key: running, waiting (parked on it) and its limit (none: unlimited); per
    queue and fairness key: the share of the queue's fair starts over the last five minutes
    and the share its weight owes it. One series per key: keep keys to a few thousand."""
    key_jobs = GaugeMetricFamily(
        "pgqueue_key_jobs",
        "Jobs per limit key (tenant) that run or wait for a slot.",
        labels=["key", "state"],
    )
    key_limit = GaugeMetricFamily(
        "pgqueue_key_limit", "Each limit key's max_running (* is the default).", labels=["key"]
    )
    for limit in run(conn, concurrency.list_limits_plan(schema), together=False):
        key_jobs.add_metric([limit.key, "running"], limit.running)
        key_jobs.add_metric([limit.key, "waiting"], limit.waiting)
        if limit.max_running is not None:
            key_limit.add_metric([limit.key], limit.max_running)
    share = GaugeMetricFamily(
        "pgqueue_fair_share",
        "Each fairness key's share of its queue's fair starts over the last five minutes, "
        "received and owed (by weight, among the keys with jobs or starts).",
        labels=["queue", "key", "kind"],
    )
    shares = fairness.shares_plan(schema, SHARE_WINDOW_SECONDS)
    for row in run(conn, shares, together=False):
        share.add_metric([row.queue, row.key, "owed"], row.owed)
        if row.share is not None:
            share.add_metric([row.queue, row.key, "received"], row.share)
    return [key_jobs, key_limit, share]


def registry_for_worker(
    worker: ObservedWorker, dsn: str, *, database: bool = True
) -> CollectorRegistry:
    """A registry with `worker`'s metrics, its collector and (unless not `database`: a
    supervised worker, whose supervisor reads them once for all) the database's, and the
    worker told of its jobs."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics()
    worker.add_observer(metrics)
    registry.register(metrics)
    registry.register(WorkerCollector(worker))
    if database:
        registry.register(DatabaseCollector(dsn, worker.schema))
    return registry


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> None:
    """Serve `registry` at http://addr:port/metrics from a thread of its own."""
    start_http_server(port, addr=addr, registry=registry)
