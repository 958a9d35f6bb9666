"""OpenTelemetry: an enqueue span in the enqueuing process, and a job span in a real worker
process, its child in the same trace through the job's row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue
from tests.apps.tasks import always_fails, noop, traced_step, traced_sync_step
from tests.conftest import count, stop_worker_processes, wait_until, worker_process

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="needs opentelemetry-sdk")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from pgqueue import tracing  # noqa: E402


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Enqueue spans of this process, instrumented for the test only."""
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(provider)
    yield exporter
    tracing.uninstrument()


def spans_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_job_span_in_the_worker_is_the_child_of_its_enqueue_span(
    exported: InMemorySpanExporter, dsn: str, schema: str, tmp_path: Path
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn) as conn:
        one = queue.enqueue(traced_step.job(1), conn=conn)
        conn.commit()
    many = queue.enqueue_many([traced_sync_step.job(n) for n in range(2, 5)])
    bulk = queue.enqueue_many([noop.job() for _ in range(70)])  # by COPY
    bad = queue.enqueue(always_fails.job(note="x"))
    [single, batch, copied, failing] = exported.get_finished_spans()
    assert single.name == "enqueue default" and single.kind.name == "PRODUCER"
    assert single.attributes is not None
    assert single.attributes["messaging.system"] == "pgqueue"
    assert single.attributes["messaging.message.id"] == str(int(one))
    assert batch.attributes is not None and batch.attributes["messaging.batch.message_count"] == 3
    proc = worker_process(
        dsn, schema, "--trace", log=tmp_path / "worker.log", app="tests.apps.traced_app:queue",
        env={"PGQUEUE_TEST_SPANS": str(spans_file)},
    )  # fmt: skip
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_until(lambda: count(conn, schema, "job_history") == 75, what="all 75 jobs")
        wait_until(lambda: sum(s["kind"] == "CONSUMER" for s in spans_of(spans_file)) >= 76)
    finally:
        stop_worker_processes([proc])
    spans = spans_of(spans_file)
    by_job: dict[int, list[dict[str, Any]]] = {}
    for s in spans:
        if s["kind"] == "CONSUMER":
            by_job.setdefault(int(s["attributes"]["messaging.message.id"]), []).append(s)

    def hex_id(span: Any) -> str:
        return format(span.get_span_context().span_id, "016x")

    def trace_of(span: Any) -> str:
        return format(span.get_span_context().trace_id, "032x")

    [ran] = by_job[int(one)]
    assert ran["name"] == "process default" and ran["parent_id"] == hex_id(single)
    assert ran["trace_id"] == trace_of(single)
    assert ran["attributes"]["pgqueue.task"] == "traced_step"
    assert ran["attributes"]["pgqueue.outcome"] == "succeeded" and ran["status"] == "UNSET"
    inner = next(s for s in spans if s["name"] == "inner 1")
    assert inner["parent_id"] == ran["span_id"]  # the handler's own span nests in the job's
    for job_id in many:
        [ran] = by_job[int(job_id)]
        assert ran["parent_id"] == hex_id(batch)
    sync_inner = [s for s in spans if s["name"].startswith("inner sync")]
    assert len(sync_inner) == 3
    assert {s["parent_id"] for s in sync_inner} == {by_job[int(i)][0]["span_id"] for i in many}
    assert all(by_job[int(i)][0]["parent_id"] == hex_id(copied) for i in bulk)
    attempts = by_job[int(bad)]
    assert [a["attributes"]["pgqueue.outcome"] for a in attempts] == ["retried", "failed"]
    assert all(a["status"] == "ERROR" and a["parent_id"] == hex_id(failing) for a in attempts)


def test_without_instrumenting_no_trace_context_is_stored(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    queue.enqueue(noop.job())
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert count(conn, schema, "jobs", "trace_context IS NULL") == 1


def test_a_job_of_a_trace_the_enqueuer_dropped_records_no_span_nor_its_handlers(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    spans_file = tmp_path / "spans.jsonl"
    tracing.instrument(sdk.TracerProvider(sampler=ALWAYS_OFF))
    try:
        queue = Queue(dsn, schema=schema)
        dropped = queue.enqueue(traced_step.job(7))
    finally:
        tracing.uninstrument()
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(carried,)] = conn.execute(
            f'SELECT trace_context FROM "{schema}".jobs WHERE id = %s', [int(dropped)]
        ).fetchall()
        assert int(carried["traceparent"][-2:], 16) & 1 == 0  # its flags say: not sampled
        kept = queue.enqueue(traced_step.job(8))  # not instrumented: a root span of its own
        proc = worker_process(
            dsn, schema, "--trace", log=tmp_path / "worker.log", app="tests.apps.traced_app:queue",
            env={"PGQUEUE_TEST_SPANS": str(spans_file)},
        )  # fmt: skip
        try:
            wait_until(lambda: count(conn, schema, "job_history") == 2, what="both jobs run")
            wait_until(lambda: any(s["name"] == "inner 8" for s in spans_of(spans_file)))
        finally:
            stop_worker_processes([proc])
    names = [s["name"] for s in spans_of(spans_file)]
    ids = [s["attributes"].get("messaging.message.id") for s in spans_of(spans_file)]
    assert "inner 7" not in names and str(int(dropped)) not in ids
    assert "inner 8" in names and str(int(kept)) in ids
