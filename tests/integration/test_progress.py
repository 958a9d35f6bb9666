"""Progress reports: a handler reports as often as it likes, the job's row is written at most
once a second, get_job shows the latest, and the last one is kept with the outcome."""

from __future__ import annotations

import time

import psycopg
import pytest

from pgqueue import InvalidArgumentsError, JobContext, JobStatus, Queue, Worker
from tests.conftest import wait_until, worker_in_thread


def test_progress_is_written_at_most_once_a_second_and_kept_at_the_end(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    seen: list[dict[str, object] | None] = []

    @queue.task
    def crunch(steps: int, ctx: JobContext) -> str:
        started = time.monotonic()
        step = 0
        while time.monotonic() - started < 2.5:
            step += 1
            ctx.set_progress(min(step / steps, 1.0), f"step {step}", rows=step)
            time.sleep(0.0005)
        ctx.set_progress(1.0, "done", rows=step)
        return "ok"

    queue.migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Count every write of a job's progress column, as the server sees them.
        conn.execute(f'CREATE TABLE "{schema}".progress_writes (job_id bigint)')
        conn.execute(
            f"""CREATE FUNCTION "{schema}".count_progress() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN INSERT INTO "{schema}".progress_writes VALUES (NEW.id); RETURN NULL; END $$"""
        )
        conn.execute(
            f'CREATE TRIGGER count_progress AFTER UPDATE OF progress ON "{schema}".jobs '
            f"FOR EACH ROW WHEN (NEW.progress IS DISTINCT FROM OLD.progress) "
            f'EXECUTE FUNCTION "{schema}".count_progress()'
        )
    job_id = queue.enqueue(crunch.job(100_000))
    worker = Worker(queue, dsn=dsn, schema=schema, poll_interval=0.05)
    with worker_in_thread(worker):

        def reported() -> bool:
            job = queue.get_job(job_id)
            seen.append(job.progress if job else None)
            return job is not None and job.progress is not None

        wait_until(reported, what="a progress report on the running job")
        live = seen[-1]
        assert live is not None and 0 < float(live["fraction"]) <= 1  # type: ignore[arg-type]
        assert str(live["message"]).startswith("step ") and "at" in live

        def done() -> bool:
            job = queue.get_job(job_id)
            return job is not None and job.status is JobStatus.SUCCEEDED

        wait_until(done, what="the job to finish")
    job = queue.get_job(job_id)
    assert job is not None and job.progress is not None
    assert job.progress["fraction"] == 1.0 and job.progress["message"] == "done"
    meta = job.progress["meta"]
    assert isinstance(meta, dict) and meta["rows"] > 1000  # thousands of reports were made
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".progress_writes').fetchone()
    assert row is not None and 1 <= row[0] <= 4  # 2.5 s of reports: one write a second


@pytest.mark.parametrize(
    ("fraction", "message", "meta"),
    [
        (1.5, "", {}),
        (float("nan"), "", {}),
        (True, "", {}),
        (0.5, "x" * 1001, {}),
        (0.5, "", {"bad": {1, 2}}),
        (0.5, "nul\x00", {}),
    ],
)
def test_a_bad_report_is_an_error_in_the_handler(
    fraction: object, message: object, meta: dict[str, object]
) -> None:
    ctx = JobContext(1, "t", "default", 1, 1)
    with pytest.raises(InvalidArgumentsError):
        ctx.set_progress(fraction, message, **meta)  # type: ignore[arg-type]
