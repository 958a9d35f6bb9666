"""The application bench/dashboard/suite.py's workers run: a no-op task and one that waits a
millisecond. With
PGQUEUE_BENCH_TRACE set (the ratio of traces kept, 1 for all), the process exports its spans
through OpenTelemetry's SDK with a batch processor, as a traced application would, to an
exporter that only counts them: the cost measured is the spans', not a network's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from pgqueue import Queue

queue = Queue()


@queue.task(name="bench_noop")
def bench_noop(n: int) -> None:
    pass


@queue.task(name="bench_io")
async def bench_io(n: int) -> None:
    """A job that waits a millisecond on I/O, as a call to another service would."""
    await asyncio.sleep(0.001)


if os.environ.get("PGQUEUE_BENCH_TRACE"):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Counted(SpanExporter):
        def __init__(self) -> None:
            self.spans = 0

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.spans += len(spans)
            return SpanExportResult.SUCCESS

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # As OTEL_TRACES_SAMPLER=parentbased_traceidratio would: a job follows its enqueue's
    # decision, which PGQUEUE_BENCH_TRACE gives as the ratio of traces kept.
    sampler = ParentBased(TraceIdRatioBased(float(os.environ["PGQUEUE_BENCH_TRACE"])))
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Counted()))
    trace.set_tracer_provider(provider)
