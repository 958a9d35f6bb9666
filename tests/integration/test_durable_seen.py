"""Durable jobs as an operator sees them: Queue.job_steps, the step events a worker's
observers are told of, the metrics and the trace spans built from them."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pgqueue import JobContext, Queue, RetryPolicy, SignalTimeoutError, Worker
from pgqueue.hooks import StepEvent


class Steps:
    """An observer that keeps each step event as (job, seq, kind, what)."""

    def __init__(self) -> None:
        self.events: list[StepEvent] = []

    def job_started(self, job: Any) -> None:
        pass

    def job_finished(self, job: Any, outcome: Any) -> None:
        pass

    def claimed(self, seconds: float, jobs: int) -> None:
        pass

    def step_event(self, event: StepEvent) -> None:
        self.events.append(event)

    def seen(self) -> list[tuple[int, str, str]]:
        return [(e.seq, e.kind, e.what) for e in self.events]


def burst(queue: Queue, dsn: str, *observers: Any) -> None:
    Worker(queue, dsn=dsn, burst=True, observers=list(observers)).run()


def test_job_steps_lists_what_a_sleeping_job_recorded_and_until_when_it_sleeps(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="remind")
    def remind(ctx: JobContext) -> None:
        ctx.step("welcome", lambda: {"mail": "<b>hi</b>"})
        ctx.sleep(timedelta(days=3), name="three days")
        ctx.step("reminder", lambda: "sent")

    job_id = queue.enqueue(remind.job())
    before = datetime.now(timezone.utc)
    burst(queue, dsn)
    seen = queue.job_steps(job_id)
    assert [(s.seq, s.name, s.kind, s.state) for s in seen.steps] == [
        (1, "welcome", "step", "recorded"),
        (2, "three days", "sleep", "sleep"),
    ]
    assert seen.steps[0].result == {"mail": "<b>hi</b>"}
    assert seen.steps[0].duration is not None and seen.steps[0].duration >= timedelta(0)
    assert seen.sleeping_until is not None
    assert seen.sleeping_until > before + timedelta(days=2, hours=23)
    assert seen.steps[1].sleeps_until == seen.sleeping_until
    assert seen.waiting == "sleep" and seen.waiting_for is None


def test_job_steps_says_which_signal_a_parked_job_waits_for_and_what_it_took(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="approve")
    def approve(ctx: JobContext) -> str:
        decision = ctx.wait_for_signal("order-9", timeout=timedelta(hours=1))
        with contextlib.suppress(SignalTimeoutError):
            ctx.wait_for_signal("never", timeout=0, name="second look")
        return str(decision)

    job_id = queue.enqueue(approve.job())
    burst(queue, dsn)
    parked = queue.job_steps(job_id)
    assert parked.steps == [] and parked.waiting == "signal"
    assert parked.waiting_for == "order-9" and parked.sleeping_until is None
    assert parked.waiting_until is not None and parked.waiting_since is not None
    assert parked.waiting_since < parked.waiting_until
    queue.signal("order-9", {"ok": True})
    burst(queue, dsn)
    done = queue.job_steps(job_id)  # the job is in history now: its steps stay with it
    assert queue.get_job(job_id).status.value == "succeeded"  # type: ignore[union-attr]
    assert [(s.name, s.kind, s.state) for s in done.steps] == [
        ("order-9", "signal", "signal wait"),
        ("second look", "signal", "timed out"),
    ]
    assert done.steps[0].result["payload"] == {"ok": True}
    assert done.waiting is None


def test_job_steps_of_a_job_without_steps_or_of_no_job_is_empty(queue: Queue, dsn: str) -> None:
    @queue.task(name="plain")
    def plain() -> None:
        pass

    job_id = queue.enqueue(plain.job())
    assert queue.job_steps(job_id).steps == []
    assert queue.job_steps(10**12).steps == []


def test_observers_are_told_of_each_step_run_replayed_slept_and_parked(
    queue: Queue, dsn: str
) -> None:
    tries: list[int] = []

    @queue.task(name="flaky", retry=RetryPolicy(base=0))
    def flaky(ctx: JobContext) -> None:
        ctx.step("one", lambda: 1)
        tries.append(ctx.attempt)
        if len(tries) == 1:
            raise ConnectionError("first attempt fails after its step")
        ctx.sleep(0, name="nap")
        ctx.wait_for_signal("go")

    job_id = queue.enqueue(flaky.job())
    steps = Steps()
    burst(queue, dsn, steps)
    assert steps.seen() == [
        (1, "step", "started"),
        (1, "step", "recorded"),
        (1, "step", "replayed"),  # the retry
        (2, "sleep", "recorded"),  # a sleep of 0 goes on at once
        (3, "signal", "parked"),
    ]
    assert all(e.job.id == job_id for e in steps.events)
    parked = steps.events[-1]
    assert parked.key == "go" and parked.until is None  # no timeout
    recorded = steps.events[1]
    assert recorded.duration is not None and recorded.duration >= 0


def test_a_step_that_raises_is_told_as_failed_with_its_error(queue: Queue, dsn: str) -> None:
    @queue.task(name="boom", max_attempts=1)
    def boom(ctx: JobContext) -> None:
        ctx.step("explode", lambda: 1 / 0)

    queue.enqueue(boom.job())
    steps = Steps()
    burst(queue, dsn, steps)
    assert steps.seen() == [(1, "step", "started"), (1, "step", "failed")]
    assert isinstance(steps.events[1].error, ZeroDivisionError)


def test_a_renamed_step_is_told_as_a_mismatch(queue: Queue, dsn: str) -> None:
    names = iter(["old", "new"])

    @queue.task(name="renamed", retry=RetryPolicy(base=0))
    def renamed(ctx: JobContext) -> None:
        ctx.step(next(names), lambda: 1)
        ctx.sleep(0)
        raise ConnectionError("fail once")

    queue.enqueue(renamed.job())
    steps = Steps()
    burst(queue, dsn, steps)
    assert (1, "step", "mismatch") in steps.seen()


prometheus = pytest.importorskip("prometheus_client", reason="needs pgqueue-py[metrics]")


def test_metrics_count_steps_replays_sleeps_signal_waits_and_deliveries(
    queue: Queue, dsn: str
) -> None:
    from pgqueue.metrics import WorkerMetrics

    @queue.task(name="flow", retry=RetryPolicy(base=0))
    def flow(ctx: JobContext) -> None:
        ctx.step("a", lambda: 1)
        ctx.step("b", lambda: 2)
        ctx.sleep(0)
        ctx.wait_for_signal("k")

    queue.enqueue(flow.job())
    metrics = WorkerMetrics()
    burst(queue, dsn, metrics)  # parks at the wait
    queue.signal("k", 1)
    burst(queue, dsn, metrics)  # replays a, b and the sleep; takes the signal
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.collect()
        for s in family.samples
    }
    labels = (("queue", "default"), ("task", "flow"))
    assert samples[("pgqueue_steps_recorded_total", labels)] == 2
    assert samples[("pgqueue_steps_replayed_total", labels)] == 3
    assert samples[("pgqueue_sleeps_total", labels)] == 1
    assert samples[("pgqueue_signal_waits_total", labels)] == 1
    assert samples[("pgqueue_signals_delivered_total", labels)] == 1
    assert ("pgqueue_step_mismatches_total", labels) not in samples


def test_the_queue_gauges_count_sleeping_and_parked_jobs_apart(
    queue: Queue, dsn: str, schema: str
) -> None:
    from pgqueue.metrics import DatabaseCollector

    @queue.task(name="sleeper")
    def sleeper(ctx: JobContext) -> None:
        ctx.sleep(timedelta(hours=1))

    @queue.task(name="waiter")
    def waiter(ctx: JobContext) -> None:
        ctx.wait_for_signal("never")

    @queue.task(name="later")
    def later() -> None:
        pass

    queue.enqueue_many([sleeper.job(), sleeper.job(), waiter.job()])
    queue.enqueue(later.job(), delay=timedelta(hours=1))  # scheduled, neither
    burst(queue, dsn)
    collector = DatabaseCollector(dsn, schema)
    try:
        samples = {
            (s.name, tuple(s.labels.items())): s.value
            for family in collector.collect()
            for s in family.samples
        }
    finally:
        collector.close()
    assert samples[("pgqueue_queue_jobs", (("queue", "default"), ("status", "scheduled")))] == 4
    assert samples[("pgqueue_queue_jobs_sleeping", (("queue", "default"),))] == 2
    assert samples[("pgqueue_queue_jobs_waiting_for_signal", (("queue", "default"),))] == 1


def test_a_step_that_runs_is_a_child_span_of_its_job_and_the_rest_are_events(
    queue: Queue, dsn: str
) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pgqueue.tracing import JobTracer

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inner = provider.get_tracer("test")

    def charge() -> int:
        with inner.start_as_current_span("provider call"):
            return 42

    @queue.task(name="traced", retry=RetryPolicy(base=0))
    def traced(ctx: JobContext) -> None:
        ctx.step("charge", charge)
        ctx.sleep(0, name="nap")
        ctx.wait_for_signal("go", name="approval")

    queue.enqueue(traced.job())
    tracer = JobTracer(provider)
    burst(queue, dsn, tracer)  # runs the step, parks
    queue.signal("go", True)
    burst(queue, dsn, tracer)  # replays the step and the sleep, takes the signal
    spans = exporter.get_finished_spans()
    jobs = [s for s in spans if s.name == "process default"]
    steps = [s for s in spans if s.name == "pgqueue.step charge"]
    [call] = [s for s in spans if s.name == "provider call"]
    assert len(jobs) == 2 and len(steps) == 1  # the replay makes no span, an event
    first, second = sorted(jobs, key=lambda s: s.start_time or 0)
    [step] = steps
    assert step.parent is not None and step.parent.span_id == first.context.span_id
    assert call.parent is not None and call.parent.span_id == step.context.span_id
    assert step.attributes is not None and step.attributes["pgqueue.step.seq"] == 1
    assert step.attributes["pgqueue.step.replayed"] is False
    assert [e.name for e in first.events] == ["pgqueue.signal.wait"]
    assert first.events[0].attributes is not None
    assert first.events[0].attributes["pgqueue.signal.key"] == "go"
    assert [e.name for e in second.events] == [
        "pgqueue.step.replayed",
        "pgqueue.step.replayed",
        "pgqueue.signal.received",
    ]
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached here
