"""Job middleware in a real worker: around each call of a handler, the first outermost,
seeing what the handler raises, and able to call it again or answer in its place."""

from __future__ import annotations

import contextvars
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from pgqueue import ConfigurationError, Queue, Worker
from pgqueue.hooks import JobMiddleware
from pgqueue.models import ClaimedJob

Next = Callable[[], Awaitable[Any]]
seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


class Tagging:
    """Logs its name before and after the rest of the chain, and what came through it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def __call__(self, job: ClaimedJob, call_next: Next) -> Any:
        self.log.append(f"{self.name} before {job.task}")
        token = seen.set(seen.get() + self.name)
        try:
            result = await call_next()
        except Exception as exc:
            self.log.append(f"{self.name} saw {exc!r}")
            raise
        finally:
            seen.reset(token)
        self.log.append(f"{self.name} after {job.task}")
        return result


def run_one(queue: Queue, dsn: str, job: Any, middleware: Sequence[JobMiddleware]) -> int:
    """Enqueue `job` and run it in a worker of its own with `middleware`; its id."""
    job_id = int(queue.enqueue(job))
    Worker(queue, dsn=dsn, burst=True, middleware=middleware).run()
    return job_id


@pytest.mark.parametrize("atomic", [False, True])
def test_middleware_wraps_sync_and_async_handlers_first_outermost(
    queue: Queue, dsn: str, atomic: bool
) -> None:
    log: list[str] = []

    @queue.task(name="sync_ok", atomic=atomic)
    def sync_ok() -> str:
        log.append("sync_ok ran")
        return seen.get()  # the middleware's context reaches the handler's thread

    @queue.task(name="async_ok", atomic=atomic)
    async def async_ok() -> str:
        log.append("async_ok ran")
        return seen.get()

    for task in (sync_ok, async_ok):
        log.clear()
        job_id = run_one(queue, dsn, task.job(), [Tagging("outer", log), Tagging("inner", log)])
        assert queue.wait(job_id, timeout=30) == "outerinner"
        assert log == [
            f"outer before {task.name}",
            f"inner before {task.name}",
            f"{task.name} ran",
            f"inner after {task.name}",
            f"outer after {task.name}",
        ]


def test_what_the_handler_raises_passes_through_every_middleware_and_fails_the_job(
    queue: Queue, dsn: str
) -> None:
    log: list[str] = []

    @queue.task(name="broken", max_attempts=1)
    async def broken() -> None:
        raise ValueError("no")

    job_id = run_one(queue, dsn, broken.job(), [Tagging("outer", log), Tagging("inner", log)])
    assert log == [
        "outer before broken",
        "inner before broken",
        "inner saw ValueError('no')",
        "outer saw ValueError('no')",
    ]
    record = queue.get_job(job_id)
    assert record is not None and record.status == "failed"
    assert record.last_error == "ValueError: no"


def test_middleware_that_calls_again_retries_within_the_same_attempt(
    queue: Queue, dsn: str
) -> None:
    calls: list[int] = []

    @queue.task(name="flaky", max_attempts=1)
    def flaky() -> int:
        calls.append(len(calls))
        if len(calls) < 3:
            raise ConnectionError("not yet")
        return len(calls)

    async def again(job: ClaimedJob, call_next: Next) -> Any:
        for _ in range(4):
            try:
                return await call_next()
            except ConnectionError:
                continue
        return await call_next()

    job_id = run_one(queue, dsn, flaky.job(), [again])
    assert queue.wait(job_id, timeout=30) == 3
    record = queue.get_job(job_id)
    assert record is not None and record.attempt == 1 and record.errors == []


def test_middleware_that_answers_itself_skips_the_handler_and_its_answer_is_the_result(
    queue: Queue, dsn: str
) -> None:
    ran: list[str] = []

    @queue.task(name="costly")
    async def costly(key: str) -> str:
        ran.append(key)
        return f"computed {key}"

    async def cached(job: ClaimedJob, call_next: Next) -> Any:
        if job.args == {"key": "known"}:
            return "from the cache"
        return await call_next()

    known = run_one(queue, dsn, costly.job("known"), [cached])
    other = run_one(queue, dsn, costly.job("other"), [cached])
    assert queue.wait(known, timeout=30) == "from the cache"
    assert queue.wait(other, timeout=30) == "computed other"
    assert ran == ["other"]


def test_middleware_that_raises_instead_ends_the_attempt_as_a_handler_raising_would(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="quiet", max_attempts=1)
    async def quiet() -> None:
        return None

    async def refusing(job: ClaimedJob, call_next: Next) -> Any:
        raise PermissionError(f"job {job.id} refused")

    job_id = run_one(queue, dsn, quiet.job(), [refusing])
    record = queue.get_job(job_id)
    assert record is not None and record.status == "failed"
    assert record.last_error == f"PermissionError: job {job_id} refused"


def test_without_middleware_the_handler_is_awaited_with_no_frame_between(
    queue: Queue, dsn: str
) -> None:
    @queue.task(name="where")
    async def where() -> list[str]:
        return [f"{f.filename.rpartition('/')[2]}:{f.name}" for f in traceback.extract_stack()]

    def below_run(stack: list[str]) -> list[str]:
        """The frames from the executor's run to the handler."""
        return stack[stack.index("executor.py:run") + 1 :]

    bare = queue.wait(run_one(queue, dsn, where.job(), []), timeout=30)
    wrapped = queue.wait(run_one(queue, dsn, where.job(), [Tagging("t", [])]), timeout=30)
    assert below_run(bare) == ["executor.py:_call", "test_middleware.py:where"]
    assert "test_middleware.py:__call__" in below_run(wrapped)


def test_a_worker_refuses_middleware_that_is_not_an_async_callable(queue: Queue, dsn: str) -> None:
    def plain(job: ClaimedJob, call_next: Next) -> Any:
        return call_next()

    with pytest.raises(ConfigurationError, match="async callables"):
        Worker(queue, dsn=dsn, middleware=[plain])
    with pytest.raises(ConfigurationError, match="list of job middleware"):
        Worker(queue, dsn=dsn, middleware=Tagging("t", []))  # type: ignore[arg-type]
