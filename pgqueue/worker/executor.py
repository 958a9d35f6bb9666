"""Runs one job and returns its outcome. No SQL.

Owns: finding the handler, loading its arguments, calling it (`async def` on the event loop,
`def` in the worker's thread pool), and turning whatever happens into an Outcome. A requested
cancellation cancels an `async def` handler and sets `ctx.cancel_requested` for a `def` one;
an attempt during which cancellation was requested ends as cancelled, however it ended. Nothing a
handler does escapes as an exception, not SystemExit, KeyboardInterrupt or an exception whose
str() raises: the worker lives on and the job's failure is recorded. The one exception that
does escape is asyncio.CancelledError, raised when the worker is stopping; the job is then
put back rather than failed. A job past the time its rate limits need it to start by
(ClaimedJob.start_by) is not started: it is put back, its attempt unspent.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

from pgqueue.codec import to_json_result
from pgqueue.errors import (
    InvalidArgumentsError,
    StepMismatchError,
    StepResultError,
    UnknownTaskError,
)
from pgqueue.hooks import JobMiddleware
from pgqueue.models import ClaimedJob, RetryPolicy
from pgqueue.registry import CancelSignal, JobContext, Progress, Registry, Snooze, Task
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Health
from pgqueue.values import Unreadable
from pgqueue.worker.checkpoints import (
    AsyncAtomicBackend,
    AtomicBackend,
    Backend,
    LeaseBackend,
    StepRecorder,
)
from pgqueue.worker.durable import Durable, Parked
from pgqueue.worker.middleware import chained, chained_in_thread
from pgqueue.worker.observe import Observers
from pgqueue.worker.outcome import Outcome, cancelled, failed, late, snoozed
from pgqueue.worker.threads import Handoff, Threads

log = logging.getLogger("pgqueue.job")
_DEFAULT_RETRY = RetryPolicy()


class Executor:
    """Runs jobs of the tasks in `registry`; sync handlers in a pool of at most `max_threads`
    threads, started as they are needed."""

    name = "executor"

    def __init__(
        self,
        registry: Registry,
        max_threads: int,
        max_result_bytes: int,
        *,
        dsn: str | None = None,
        schema: str = "pgqueue",
        prepare: bool = True,
        observers: Observers | None = None,
        middleware: tuple[JobMiddleware, ...] = (),
    ) -> None:
        """`dsn` and `schema`: where lease jobs record their durable steps (durable.py), on
        a connection opened at the first step; `observers` are told of each step;
        `middleware` wraps each call of a handler (middleware.py)."""
        self.registry = registry
        self.threads = Threads(max_threads, "pgqueue-job")
        self.max_result_bytes = max_result_bytes
        self.schema = schema
        self.steps = (
            None if dsn is None else StepRecorder(Link(dsn, "steps", prepare=prepare), schema)
        )
        self._handoff: Handoff | None = None
        self.observers = observers
        self.middleware = middleware

    async def start(self) -> None:
        """Nothing to start: threads start with the first sync jobs."""

    async def stop(self, deadline: float) -> None:
        """Sync handlers cannot be interrupted: threads still running one are left to end on
        their own (their jobs were put back), and nothing waits for them."""
        self.threads.shutdown()
        if self.steps is not None:
            await self.steps.link.close()

    def health(self) -> Health:
        return Health(True)

    async def run(
        self,
        job: ClaimedJob,
        connection: Any = None,
        cancel: CancelSignal | None = None,
        progress: Progress | None = None,
    ) -> Outcome:
        """Run one attempt; `connection` is handed to an atomic task's JobContext, `cancel`
        tells it (and this attempt) that cancellation was requested, `progress` keeps what
        it reports."""
        started = time.monotonic()
        try:
            task, args, kwargs = self._prepare(job, connection, cancel, progress)
            if self.middleware:  # a branch, not a frame, for a worker without any
                value = await self._wrapped(job, task, args, kwargs, cancel)
            elif task.is_async:
                _check_start(job)
                if cancel is not None:
                    _interrupt_on_request(cancel)
                value = await _call(task.fn(*args, **kwargs), task.policy.timeout)
            else:
                # In a copy of this task's context, as asyncio.to_thread does: what the worker
                # set for the job (its trace span) holds in the handler's thread too.
                call = functools.partial(contextvars.copy_context().run, task.fn, *args, **kwargs)
                if job.start_by is not None:  # checked in the thread, right before the call
                    call = functools.partial(_started_in_time, job, call)
                value = await _within(self._thread(call), task.policy.timeout)
        except asyncio.CancelledError:
            if cancel is not None and cancel.requested and not _stopping():
                return self._cancelled(job, started)
            raise
        except StartedLateError:
            return self._late(job, started)
        except BaseException as exc:
            if cancel is not None and cancel.requested:
                return self._cancelled(job, started)
            return self._failed(job, exc, started)
        if cancel is not None and cancel.requested:
            return self._cancelled(job, started)
        return self._succeeded(job, value, started)

    def _wrapped(
        self,
        job: ClaimedJob,
        task: Task[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
        cancel: CancelSignal | None,
    ) -> Awaitable[Any]:
        """The handler's call inside the middleware, each call of `call_next` a new call of
        the handler under its timeout, as `run` makes it."""
        _check_start(job)
        fn, timeout = task.fn, task.policy.timeout
        assert fn is not None  # _prepare refuses a task without a handler
        if task.is_async:
            if cancel is not None:
                _interrupt_on_request(cancel)
            return chained(self.middleware, job, lambda: _call(fn(*args, **kwargs), timeout))

        def in_thread() -> Awaitable[Any]:
            # The middleware's context too, copied when the handler is called.
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            if job.start_by is not None:
                call = functools.partial(_started_in_time, job, call)
            return _within(self._thread(call), timeout)

        return chained(self.middleware, job, in_thread)

    def _thread(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run `call` in the thread pool; the future has its result or exception."""
        loop = asyncio.get_running_loop()
        if self._handoff is None or self._handoff.loop is not loop:
            self._handoff = Handoff(loop, self.threads)
        return self._handoff.run(call)

    def run_sync(self, job: ClaimedJob, connection: Any) -> Outcome:
        """Run one attempt of a sync atomic task in the calling thread, on its connection.

        A sync handler cannot be interrupted, so its timeout is applied when it returns: an
        attempt that took longer fails with JobTimeoutError (and its writes are rolled back by
        the caller). Meanwhile only the server's idle-in-transaction backstop bounds it."""
        started = time.monotonic()
        try:
            task, args, kwargs = self._prepare(job, connection)
            if self.middleware:
                value = chained_in_thread(self.middleware, job, lambda: task.fn(*args, **kwargs))
            else:
                value = task.fn(*args, **kwargs)
            limit = task.policy.timeout
            if limit is not None and time.monotonic() - started > limit.total_seconds():
                raise JobTimeoutError(
                    f"the job ran longer than its timeout of {limit.total_seconds():g} s"
                )
        except BaseException as exc:
            return self._failed(job, exc, started)
        return self._succeeded(job, value, started)

    def _prepare(
        self,
        job: ClaimedJob,
        connection: Any,
        cancel: CancelSignal | None = None,
        progress: Progress | None = None,
    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """The job's task and typed call arguments; raises UnknownTaskError or
        InvalidArgumentsError, which _failed turns into the right outcome."""
        task = self.registry.get(job.task)
        if task.fn is None:
            raise UnknownTaskError(f"task {job.task!r} is declared but has no handler here")
        context = None
        if task.takes_context:  # not built for nobody: half a microsecond of each job
            context = JobContext(
                job.id,
                job.task,
                job.queue,
                job.attempt,
                job.max_attempts,
                connection,
                cancel,
                progress,
                job.worker_id,
                Durable(
                    job,
                    self.schema,
                    self._backend(job, connection),
                    self.max_result_bytes,
                    cancel,
                    self.observers,
                ),
            )
        if isinstance(job.args, Unreadable):
            raise InvalidArgumentsError(f"its stored arguments cannot be read: {job.args.reason}")
        args, kwargs = task.load_args(job.args, context)
        return task, args, kwargs

    def _backend(self, job: ClaimedJob, connection: Any) -> Backend:
        """Where the job's durable steps are recorded: in its own transaction (atomic), else
        on the steps link."""
        if connection is None:
            if self.steps is None:
                return Backend()  # its calls say which twin to use, then fail
            return LeaseBackend(self.steps, asyncio.get_running_loop())
        if isinstance(connection, psycopg.Connection):
            return AtomicBackend(connection, self.schema, job)
        return AsyncAtomicBackend(connection, self.schema, job)

    def _retry_policy(self, name: str) -> RetryPolicy:
        try:
            return self.registry.get(name).policy.retry
        except UnknownTaskError:
            return _DEFAULT_RETRY

    def _succeeded(self, job: ClaimedJob, value: Any, started: float) -> Outcome:
        if isinstance(value, Snooze):
            return self._snoozed(job, value, started)
        duration = time.monotonic() - started
        outcome = Outcome(job, "succeeded", duration)
        try:
            outcome.result = to_json_result(value, self.max_result_bytes)
        except Exception as exc:
            unstorable = ResultError(f"the handler returned a result that cannot be stored: {exc}")
            unstorable.__cause__ = exc
            return self._failed(job, unstorable, started)
        if log.isEnabledFor(logging.INFO):
            log.info(
                "job %s %s attempt %s succeeded in %.1f ms",
                job.id,
                job.task,
                job.attempt,
                duration * 1000,
            )
        return outcome

    def _cancelled(self, job: ClaimedJob, started: float) -> Outcome:
        log.info("job %s %s attempt %s cancelled on request", job.id, job.task, job.attempt)
        return cancelled(job, time.monotonic() - started)

    def _late(self, job: ClaimedJob, started: float) -> Outcome:
        return late(job, time.monotonic() - started)

    def _snoozed(self, job: ClaimedJob, snooze: Snooze, started: float) -> Outcome:
        settled = isinstance(snooze, Parked)
        return snoozed(job, snooze.seconds, settled, time.monotonic() - started)

    def failed(self, job: ClaimedJob, exc: BaseException, duration: float) -> Outcome:
        """The outcome of an attempt that ran for `duration` seconds and then failed with
        `exc` outside its handler (an atomic job whose commit the database refused)."""
        return self._failed(job, exc, time.monotonic() - duration)

    def _failed(self, job: ClaimedJob, exc: BaseException, started: float) -> Outcome:
        if isinstance(exc, Snooze):
            return self._snoozed(job, exc, started)
        # Retrying cannot make stored arguments valid for this code, nor store what the
        # handler returns (and would run its side effects again): those fail at once.
        # Nor replay a job into steps that changed, or record what is not JSON.
        retryable = not isinstance(
            exc, (InvalidArgumentsError, ResultError, StepMismatchError, StepResultError)
        )
        kind = "result" if isinstance(exc, ResultError) else "error"
        policy = self._retry_policy(job.task) if retryable else None
        return failed(job, exc, time.monotonic() - started, policy, kind)


class StartedLateError(Exception):
    """A rate-limited job's handler was not started by its start_by time (statement.py)."""


def _check_start(job: ClaimedJob) -> None:
    """Raise StartedLateError if the job's handler is past its time to start."""
    if job.start_by is not None and time.monotonic() > job.start_by:
        raise StartedLateError


def _started_in_time(job: ClaimedJob, call: Callable[[], Any]) -> Any:
    """In the handler's thread: call it, unless it is past its time to start."""
    _check_start(job)
    return call()


class JobTimeoutError(Exception):
    """The handler ran longer than its task's timeout."""


class ResultError(Exception):
    """The handler returned a value that cannot be stored as its result."""


def _interrupt_on_request(cancel: CancelSignal) -> None:
    """Cancel the calling task (the job's own) when cancellation of its job is requested:
    the handler, awaited inline, is interrupted wherever it waits. No task of its own per job:
    creating one showed up in a drain's profile."""
    current = asyncio.current_task()
    if current is not None:
        cancel.on_request(current.cancel)


def _stopping() -> bool:
    """Whether the current task was also cancelled by someone else than a cancellation
    request (the worker stopping): the job is then put back, not ended. Python 3.10 cannot
    tell; there the job ends as cancelled, as it would after being put back
    (loop.py, FetchLoop.put_back_unfinished)."""
    current = asyncio.current_task()
    cancelling = getattr(current, "cancelling", None)
    if cancelling is None:
        return False
    if cancelling() > 1:
        return True
    current.uncancel()  # type: ignore[union-attr]  # ours, from _interrupt_on_request: handled
    return False


async def _call(running: Any, timeout: timedelta | None) -> Any:
    """Await an async handler inline, so whatever it raises reaches Executor.run; under a
    timeout it runs in a task of its own (wait_for), boxed: a task that raised SystemExit or
    KeyboardInterrupt would take the event loop down with it
    (tests/integration/test_worker.py::test_handler_raising_exit_or_interrupt_fails_the_job_not_the_worker)."""
    if timeout is None:
        return await running
    ok, value = await _within(_boxed(running), timeout)
    if not ok:
        raise value
    return value


async def _boxed(running: Any) -> tuple[bool, Any]:
    """The handler's result or exception as a value."""
    try:
        return True, await running
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        return False, exc


async def _within(running: Any, timeout: timedelta | None) -> Any:
    """Await a handler, stopping it at its timeout: an async handler is cancelled; a sync one
    cannot be interrupted, so its thread runs on and its result is discarded."""
    if timeout is None:
        return await running
    try:
        return await asyncio.wait_for(running, timeout.total_seconds())
    except asyncio.TimeoutError:
        raise JobTimeoutError(
            f"the job ran longer than its timeout of {timeout.total_seconds():g} s"
        ) from None
