"""Every bad input we know of, in one place: a clear error or a recorded failure, the worker
keeps running, and nothing else is lost. Invalid queue names on the CLI are in
tests/acceptance/test_cli.py; hostile schema names in tests/unit/test_settings.py."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import InvalidArgumentsError, Queue, UnknownTaskError
from pgqueue.testing import drain, enqueued_jobs

# Run on each server CI tests against: what the server refuses, and how it says so.
pytestmark = pytest.mark.each_server


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() itself fails")


class NotJson:
    pass


def _raw_job(conn: psycopg.Connection[Any], schema: str, task: str, args: dict[str, Any]) -> int:
    """A row written by other means: another service, psql, an older version of the code."""
    row = conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, max_attempts) "
            "VALUES ('default', %s, %s::jsonb, 1) RETURNING id"
        ).format(sql.Identifier(schema)),
        [task, json.dumps(args)],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_worker_records_every_bad_job_and_keeps_running(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema, max_payload_bytes=64 * 1024)
    good_runs: list[int] = []

    def register(name: str, result: Any = None, exc: BaseException | None = None) -> Any:
        def handler() -> Any:
            if exc is not None:
                raise exc
            return result

        return queue.task(name=name, max_attempts=1)(handler)

    @queue.task(name="typed", max_attempts=1)
    def typed(user_id: int) -> None: ...

    @queue.task(name="good")
    def good(i: int) -> None:
        good_runs.append(i)

    cases = {  # name -> (expected status, text the recorded error must contain)
        # A result that cannot be stored fails the job, saying why; never a bare success.
        "nul_in_result": ("failed", "NUL character"),
        "nul_in_exception": ("failed", "ValueError: bad \\x00 byte"),
        "huge_result": ("failed", "over max_payload_bytes"),
        "object_result": ("failed", "Unable to serialize"),
        "nan_result": ("failed", "Out of range float values"),
        # Passes Python's JSON checks; PostgreSQL refuses it, alone in its batch or not.
        "surrogate_result": ("failed", "its outcome could not be stored"),
        "broken_str": ("failed", "BrokenStr: <str() of this exception raised>"),
        "sys_exit": ("failed", "SystemExit: 3"),
        "keyboard_interrupt": ("failed", "KeyboardInterrupt"),
        # An asyncio future refuses StopIteration: through run_in_executor the job hung.
        "stop_iteration": ("failed", "the handler raised StopIteration: done early"),
    }
    register("nul_in_result", result={"text": "a\x00b"})
    register("nul_in_exception", exc=ValueError("bad \x00 byte"))
    register("huge_result", result="x" * 100_000)
    register("object_result", result=NotJson())
    register("nan_result", result=float("nan"))
    register("surrogate_result", result="lone \ud800 surrogate")
    register("broken_str", exc=BrokenStr())
    register("sys_exit", exc=SystemExit(3))
    register("keyboard_interrupt", exc=KeyboardInterrupt())
    register("stop_iteration", exc=StopIteration("done early"))

    with psycopg.connect(dsn) as conn:
        ids: dict[str, int] = {name: queue.enqueue(name, {}, conn=conn) for name in cases}
        ids["unknown_task"] = _raw_job(conn, schema, "no.such.task", {"x": 1})
        ids["args_no_longer_validate"] = _raw_job(conn, schema, "typed", {"user_id": "abc"})
        cases["unknown_task"] = ("failed", "no task is registered under 'no.such.task'")
        cases["args_no_longer_validate"] = ("failed", "stored arguments no longer validate")
        queue.enqueue_many([good.job(i) for i in range(10)], conn=conn)
        conn.commit()

    drain(queue, concurrency=3)

    assert sorted(good_runs) == list(range(10))
    for name, (status, text) in cases.items():
        job = queue.get_job(ids[name])
        assert job is not None, name
        assert job.status == status, (name, job.status, job.errors)
        assert text in (job.last_error or ""), (name, job.last_error)
        assert job.result is None, name
        assert job.attempt == 1, (name, job.attempt)  # failed at once, not retried
    # The handler's own traceback is kept under the RuntimeError that carries it.
    stopped = queue.get_job(ids["stop_iteration"])
    assert stopped is not None and "in handler" in stopped.errors[-1]["traceback"]
    queue.close()


@pytest.mark.parametrize(
    ("make", "error", "text"),
    [
        (lambda t: t.job(note="a\x00b"), InvalidArgumentsError, "NUL character"),
        (lambda t: t.job(note="lone \ud800"), InvalidArgumentsError, "lone surrogate"),
        (lambda t: t.job(note="x" * 70_000), InvalidArgumentsError, "over max_payload_bytes"),
        (lambda t: t.job(note=NotJson()), InvalidArgumentsError, "not JSON"),
        (lambda t: t.job(note=float("inf")), InvalidArgumentsError, "not JSON"),
        (lambda t: t.job(note={"nested": [float("nan")]}), InvalidArgumentsError, "not JSON"),
        (lambda t: "no.such.task", TypeError, "jobs built with task.job"),
    ],
    ids=["nul", "surrogate", "huge", "object", "infinity", "nested-nan", "a-name-not-a-job"],
)
def test_bad_enqueue_raises_clearly_and_stores_nothing(
    dsn: str, schema: str, make: Any, error: type[Exception], text: str
) -> None:
    queue = Queue(dsn, schema=schema, max_payload_bytes=64 * 1024)

    @queue.task(name="t")
    def t(note: Any) -> None: ...

    with psycopg.connect(dsn) as conn:
        queue.enqueue(t.job(note="fine"), conn=conn)
        with pytest.raises(error, match=text):
            queue.enqueue_many([t.job(note="fine too"), make(t)], conn=conn)
        conn.commit()
        assert [j.args for j in enqueued_jobs(conn, queue)] == [{"note": "fine"}]
    queue.close()


def test_enqueue_of_an_unregistered_name_raises_and_stores_nothing(queue: Queue, conn: Any) -> None:
    with pytest.raises(UnknownTaskError, match=r"no task is registered under 'no\.such\.task'"):
        queue.enqueue("no.such.task", {"x": 1}, conn=conn)
    assert enqueued_jobs(conn, queue) == []


def test_a_result_that_cannot_be_stored_fails_its_job_without_a_retry(
    dsn: str, schema: str
) -> None:
    """Retrying would run the handler's side effects again for the same unstorable result."""
    queue = Queue(dsn, schema=schema)
    runs: list[int] = []

    @queue.task(name="returns_object", max_attempts=5)
    def returns_object() -> Any:
        runs.append(1)
        return NotJson()

    job_id = queue.enqueue(returns_object.job())
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempt, len(runs)) == ("failed", 1, 1)
    assert job.errors[-1]["kind"] == "result"
    assert "result that cannot be stored" in (job.last_error or "")
    queue.close()
