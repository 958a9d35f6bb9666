"""OpenTelemetry traces: a span for each enqueue, and one for each job's execution, the child
of the enqueue that made it.

Owns: `instrument()`, which registers the enqueue spans' hook (pgqueue/hooks.py) in this
process, and JobTracer, the worker's observer behind `pgqueue worker --trace`: a span per job
attempt, a child span per durable step that runs, and an event on the attempt's span for each
other durable call (a step replayed, a sleep, a signal wait; pgqueue/worker/durable.py). The
enqueuer's context travels in the job's row (its trace_context column, W3C trace context as
OTel's propagator writes it), so the link holds across processes and machines. Attributes follow
OpenTelemetry's messaging conventions: messaging.system "pgqueue", the queue as
messaging.destination.name, the job's id as messaging.message.id.

Invariants: with tracing off (the default) nothing here is imported: an enqueue finds no
hook, and a worker has no observer. The job's span is current while its handler runs, in an
`async def` handler and in a sync handler's thread alike, so spans the handler makes are its
children. A job put back when its worker stops ends its span unfinished.

Needs the `otel` extra (opentelemetry-api); which SDK and exporter export the spans is the
application's choice, configured as OpenTelemetry documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from pgqueue import hooks
from pgqueue.hooks import AttemptOutcome, StepEvent, outcome_name
from pgqueue.models import ClaimedJob, NewJob

SYSTEM = "pgqueue"


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    return trace.get_tracer("pgqueue", tracer_provider=provider)


class EnqueueSpans:
    """The enqueue hook (pgqueue.hooks.EnqueueHook) that `instrument()` registers: a PRODUCER
    span around each enqueue call, whose context the jobs' rows carry (its `carrier`)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    @contextmanager
    def enqueue(self, batch: Sequence[NewJob]) -> Iterator[list[int]]:
        queues = sorted({job.options.queue for job in batch})
        destination = queues[0] if len(queues) == 1 else "(several)"
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            "messaging.destination.name": destination,
        }
        if len(batch) > 1:
            attributes["messaging.batch.message_count"] = len(batch)
        else:
            attributes["pgqueue.task"] = batch[0].task
        with self.tracer.start_as_current_span(
            f"enqueue {destination}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            ids: list[int] = []
            yield ids
            if len(ids) == 1:
                span.set_attribute("messaging.message.id", str(ids[0]))

    def carrier(self) -> dict[str, str]:
        """The current context, inside `enqueue`'s span: that span's, for the jobs' rows."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier


# The hook `instrument()` registered, which `uninstrument()` takes away.
_registered: list[EnqueueSpans] = []


def instrument(tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every enqueue in this process from now on: one span per enqueue call, whose
    context the jobs' rows carry to the workers. Uses the global tracer provider unless
    given one; a second call replaces the first's."""
    uninstrument()
    spans = EnqueueSpans(_tracer(tracer_provider))
    hooks.register(spans)
    _registered.append(spans)


def uninstrument() -> None:
    """Stop tracing enqueues in this process."""
    while _registered:
        hooks.unregister(_registered.pop())


class JobTracer:
    """A worker's observer: a CONSUMER span per job attempt, the child of its enqueue's span
    (in the same trace) when the job carries one. A parent rather than a span link: trace
    viewers draw it, and a link on every job cost the worker a third more per job."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = _tracer(tracer_provider)
        self._open: dict[int, tuple[trace.Span | None, object]] = {}
        self._last: tuple[str, context.Context, bool] | None = None
        self._steps: dict[int, tuple[trace.Span, object]] = {}  # a step's span, while it runs

    def _enqueued(self, carrier: dict[str, Any] | None) -> tuple[context.Context | None, bool]:
        """The enqueue span's context from a job's carrier, and whether its trace was
        dropped by the enqueuer's sampler. The jobs of one enqueue call share one carrier,
        so the last one read is kept: a batch's jobs are read once."""
        if not carrier:
            return None, False
        key = str(carrier.get("traceparent"))
        if self._last is None or self._last[0] != key:
            found = propagate.extract(carrier)
            origin = trace.get_current_span(found).get_span_context()
            self._last = (key, found, origin.is_valid and not origin.trace_flags.sampled)
        return self._last[1], self._last[2]

    def job_started(self, job: ClaimedJob) -> None:
        parent, dropped = self._enqueued(job.trace_context)
        if dropped:
            # The enqueue's trace was not kept, and a parent-based sampler (OpenTelemetry's
            # default) drops its children too: the enqueue's context is made current instead
            # of a span that would be dropped, so the handler's own spans follow the same
            # decision, and a job of an unkept trace costs next to nothing.
            self._open[job.id] = (None, context.attach(parent))  # type: ignore[arg-type]
            return
        span = self.tracer.start_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            # What a sampler may decide on; the rest only on spans that are kept, since
            # setting attributes is most of what a span costs.
            attributes={"messaging.system": SYSTEM, "messaging.destination.name": job.queue},
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.operation.type": "process",
                    "messaging.message.id": str(job.id),
                    "pgqueue.task": job.task,
                    "pgqueue.attempt": job.attempt,
                }
            )
        token = context.attach(trace.set_span_in_context(span))
        self._open[job.id] = (span, token)

    def job_finished(self, job: ClaimedJob, outcome: AttemptOutcome) -> None:
        opened = self._open.pop(job.id, None)
        if opened is None:
            return
        span, token = opened
        if span is not None:
            if span.is_recording():
                self._outcome(span, outcome)
            span.end()
        context.detach(token)  # type: ignore[arg-type]

    @staticmethod
    def _outcome(span: trace.Span, outcome: AttemptOutcome) -> None:
        span.set_attribute("pgqueue.outcome", outcome_name(outcome))
        if outcome.error is not None:
            span.set_attribute("error.type", str(outcome.error.get("type") or "error"))
            span.set_status(Status(StatusCode.ERROR, str(outcome.error.get("error", ""))[:1000]))

    def claimed(self, seconds: float, jobs: int) -> None:
        pass

    def step_event(self, event: StepEvent) -> None:
        """A step that runs is a span, the child of its job's, current while its function
        runs (so the function's own spans are its children); every other durable call is an
        event on the job's span: a step replayed, a sleep, a park, a signal taken, a wait
        timed out, a mismatch."""
        opened = self._open.get(event.job.id)
        job_span = opened[0] if opened is not None else None
        if job_span is None or not job_span.is_recording():
            return  # no span, or one a sampler dropped: nothing of its steps is kept either
        if event.kind == "step" and event.what == "started":
            self._step_started(job_span, event)
        elif event.kind == "step" and event.what in ("recorded", "failed"):
            self._step_ended(event)
        elif (event.kind, event.what) in _STEP_EVENTS:
            job_span.add_event(_STEP_EVENTS[event.kind, event.what], _event_attributes(event))

    def _step_started(self, job_span: trace.Span, event: StepEvent) -> None:
        span = self.tracer.start_span(
            f"pgqueue.step {event.name}",
            context=trace.set_span_in_context(job_span),
            kind=SpanKind.INTERNAL,
            attributes={
                "messaging.message.id": str(event.job.id),
                "pgqueue.step.seq": event.seq,
                "pgqueue.step.name": event.name,
                "pgqueue.step.replayed": False,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        self._steps[event.job.id] = (span, token)

    def _step_ended(self, event: StepEvent) -> None:
        opened = self._steps.pop(event.job.id, None)
        if opened is None:
            return
        span, token = opened
        if event.error is not None:
            span.set_attribute("error.type", type(event.error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(event.error)[:1000]))
        span.end()
        context.detach(token)  # type: ignore[arg-type]


# The events a durable call other than a step that runs puts on its job's span.
_STEP_EVENTS = {
    ("step", "replayed"): "pgqueue.step.replayed",
    ("sleep", "replayed"): "pgqueue.step.replayed",
    ("signal", "replayed"): "pgqueue.step.replayed",
    ("sleep", "sleeping"): "pgqueue.sleep",
    ("signal", "parked"): "pgqueue.signal.wait",
    ("signal", "recorded"): "pgqueue.signal.received",
    ("signal", "timed out"): "pgqueue.signal.timeout",
    ("step", "mismatch"): "pgqueue.step.mismatch",
    ("sleep", "mismatch"): "pgqueue.step.mismatch",
    ("signal", "mismatch"): "pgqueue.step.mismatch",
}


def _event_attributes(event: StepEvent) -> dict[str, Any]:
    found: dict[str, Any] = {
        "pgqueue.step.seq": event.seq,
        "pgqueue.step.name": event.name,
        "pgqueue.step.kind": event.kind,
    }
    if event.what == "replayed":
        found["pgqueue.step.replayed"] = True
    if event.key is not None:
        found["pgqueue.signal.key"] = event.key
    if event.until is not None:
        found["pgqueue.until"] = event.until.isoformat()
    return found
