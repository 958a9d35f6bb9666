"""Prometheus metrics and JSON logs from a real worker process: the counters a scrape reads
after a drain match the jobs the worker ran, and each outcome is one JSON line."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import psycopg
import pytest

from pgqueue import Queue
from tests.apps.tasks import always_fails, noop
from tests.conftest import (
    count,
    free_port,
    stop_worker_processes,
    wait_until,
    worker_process,
)

parser = pytest.importorskip("prometheus_client.parser", reason="needs pgqueue-py[metrics]")


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at http://127.0.0.1:port/metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_after_a_drain_counts_the_jobs_the_worker_ran(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "worker.log"
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.enqueue_many([noop.job() for _ in range(30)], conn=conn)
        queue.enqueue_many([always_fails.job(note=f"n{i}") for i in range(5)], conn=conn)
        queue.enqueue(noop.with_options(queue="elsewhere").job(), conn=conn)  # unserved
        proc = worker_process(dsn, schema, "--metrics-port", str(port), log=log)
        try:
            wait_until(
                lambda: count(conn, schema, "job_history") == 35, what="the 35 jobs finished"
            )
            last = (("outcome", "failed"), ("queue", "default"), ("task", "always_fails"))
            wait_until(
                lambda: scrape(port).get(("pgqueue_jobs_finished_total", last)) == 5,
                what="the last outcome counted",
            )
            samples = scrape(port)
        finally:
            stop_worker_processes([proc])
    assert proc.returncode == 0, log.read_text()[-3000:]

    def finished(task: str, outcome: str) -> float:
        key = (("outcome", outcome), ("queue", "default"), ("task", task))
        return samples.get(("pgqueue_jobs_finished_total", key), 0.0)

    assert finished("noop", "succeeded") == 30
    assert finished("always_fails", "retried") == 5
    assert finished("always_fails", "failed") == 5
    assert (
        samples[("pgqueue_job_retries_total", (("queue", "default"), ("task", "always_fails")))]
        == 5
    )
    runs = samples[("pgqueue_job_run_seconds_count", (("queue", "default"), ("task", "noop")))]
    assert runs == 30
    assert samples[("pgqueue_jobs_claimed_total", ())] == 40  # 30 + 5 attempts twice
    assert samples[("pgqueue_job_wait_seconds_count", (("queue", "default"),))] == 40
    assert samples[("pgqueue_job_wait_seconds_sum", (("queue", "default"),))] > 0
    claims = samples[("pgqueue_claims_total", (("result", "jobs"),))]
    assert claims >= 1 and samples[("pgqueue_claim_seconds_count", ())] >= claims
    # The database's gauges, read at the scrape: the job nobody serves waits in its queue.
    assert samples[("pgqueue_queue_jobs", (("queue", "elsewhere"), ("status", "queued")))] == 1
    assert samples[("pgqueue_queue_oldest_job_age_seconds", (("queue", "elsewhere"),))] > 0
    assert samples[("pgqueue_database_up", ())] == 1
    assert samples[("pgqueue_workers", ())] == 1
    assert samples[("pgqueue_worker_free_slots", ())] == 10
    assert ("pgqueue_horizon_age_seconds", ()) in samples


def test_a_scrape_while_the_database_is_away_answers_and_says_so(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    from pgqueue.metrics import DatabaseCollector

    collector = DatabaseCollector(dsn, "no_such_schema")
    up = {m.name: m.samples for m in collector.collect()}
    assert up["pgqueue_database_up"][0].value == 0
    assert "pgqueue_queue_jobs" not in up
    collector.close()


def test_json_logs_give_one_line_per_job_outcome_with_its_ids(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with psycopg.connect(dsn, autocommit=True) as conn:
        ok = queue.enqueue(noop.job(), conn=conn)
        bad = queue.enqueue(always_fails.job(note="<script>"), conn=conn)
        proc = worker_process(dsn, schema, "--log-format", "json", log=log)
        try:
            wait_until(lambda: count(conn, schema, "job_history") == 2, what="both jobs finished")
        finally:
            stop_worker_processes([proc])
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    events = [(e["event"], e["job_id"]) for e in lines if "job_id" in e]
    assert events.count(("job.succeeded", ok.id)) == 1
    assert events.count(("job.retried", bad.id)) == 1
    assert events.count(("job.failed", bad.id)) == 1
    failed = next(e for e in lines if e.get("event") == "job.failed")
    assert failed["error"] == "ValueError: cannot do <script>"
    assert failed["error_type"] == "builtins.ValueError"
    assert failed["attempt"] == 2 and failed["task"] == "always_fails"
    # The worker's other records are JSON too: its start and stop.
    assert any(e.get("logger") == "pgqueue.worker" and "started" in e["message"] for e in lines)


def test_a_metrics_port_in_use_is_a_clear_error_not_a_traceback(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        log = tmp_path / "worker.log"
        proc = worker_process(
            dsn, schema, "--metrics-port", str(port), "--metrics-host", "127.0.0.1", log=log
        )
        assert proc.wait(60) == 2
    output = log.read_text()
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in output
    assert "Traceback" not in output
