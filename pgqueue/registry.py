"""Tasks: name -> handler, its argument model and its job defaults.

Owns: turning call arguments into a JSON object that validates against the handler's signature
(at enqueue), and turning a stored JSON object back into typed call arguments (in the worker).
Only registered tasks run; nothing in a job row names code to import.
Fails with InvalidArgumentsError (bad arguments, not JSON, NUL characters) or UnknownTaskError.
"""

from __future__ import annotations

import inspect
import json
import json.scanner
import math
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypedDict, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from pgqueue.codec import checked_json, is_utf8
from pgqueue.errors import ConfigurationError, InvalidArgumentsError, UnknownTaskError
from pgqueue.models import (
    LONGEST_WAIT,
    TASK_NAME,
    Enqueued,
    JobOptions,
    NewJob,
    TaskDeclaration,
    TaskPolicy,
    check_identifier,
    duration,
)
from pgqueue.steps import Steps
from pgqueue.tenants import check_templates, resolve_keys, templated

if TYPE_CHECKING:
    from typing_extensions import Unpack

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class EnqueueOptions(TypedDict, total=False):
    """The job options one enqueue (or `with_options`) may override, as keywords; JobOptions
    validates them. A time is a timedelta or seconds."""

    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None
    delay: timedelta | float | None
    dedupe_key: str | None
    dedupe_window: timedelta | float | None
    concurrency_key: str | None
    limits: Sequence[str] | None
    fairness_key: str | None
    shard_key: str | None
    tags: Sequence[str] | None


class Snooze(Exception):
    """Raise (or return) from a handler to run the job again after `seconds` without using
    an attempt: for polling something that is not ready yet. The attempt's writes of an
    atomic task are rolled back, as for any attempt that does not succeed."""

    def __init__(self, seconds: timedelta | float) -> None:
        wait = duration(seconds, "Snooze seconds")
        if wait is None or not timedelta(0) <= wait <= LONGEST_WAIT:
            raise ConfigurationError(
                f"Snooze({seconds!r}): give 0 to {LONGEST_WAIT.days} days, as seconds or a "
                "timedelta"
            )
        super().__init__(f"snoozed for {wait.total_seconds():g} s")
        self.seconds = wait.total_seconds()


class Progress:
    """A running job's latest progress report. The handler sets it (JobContext.set_progress);
    the worker writes it to the job's row at most once a second, and with the outcome."""

    __slots__ = ("report", "version", "written")

    def __init__(self) -> None:
        self.report: dict[str, Any] | None = None
        self.version = 0  # reports made
        self.written = 0  # the version last written

    def set(self, report: dict[str, Any]) -> None:
        self.report = report  # one assignment: a reader on another thread sees old or new
        self.version += 1


PROGRESS_MESSAGE_MAX = 1000
PROGRESS_META_MAX_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class JobContext:
    """Injected into a handler parameter annotated `JobContext`; never stored in args."""

    job_id: int
    task: str
    queue: str
    attempt: int
    max_attempts: int
    connection: Any = None
    """For atomic tasks: the AsyncConnection whose transaction claims and completes the job.
    Writes made on it commit together with the job's completion, or not at all."""
    cancel: CancelSignal | None = None
    progress: Progress | None = None
    worker_id: int | None = None
    """The worker running this attempt (its row in `pgqueue workers`)."""
    durable: Steps | None = None
    """This attempt's steps, sleeps and signals (pgqueue/worker/durable.py), set by the worker."""

    def set_progress(self, fraction: float | None = None, message: str = "", **meta: Any) -> None:
        """Report how far the job has come (`fraction`, 0.0 to 1.0), what it is doing, and
        any metadata (JSON values); `get_job(...).progress` shows the latest report. Cheap to
        call often: the worker writes at most one report a second per job, and the last one
        with the job's outcome. An atomic job's reports are not written: its own transaction
        holds its row."""
        if fraction is not None and (
            isinstance(fraction, bool)
            or not isinstance(fraction, (int, float))
            or not 0.0 <= fraction <= 1.0
        ):
            raise InvalidArgumentsError(f"progress is a fraction from 0.0 to 1.0, got {fraction!r}")
        if not isinstance(message, str) or len(message) > PROGRESS_MESSAGE_MAX:
            raise InvalidArgumentsError(
                f"a progress message is a string of at most {PROGRESS_MESSAGE_MAX} characters"
            )
        try:
            size = len(json.dumps(meta, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentsError(f"progress metadata is not JSON: {exc}") from None
        if size > PROGRESS_META_MAX_BYTES:
            raise InvalidArgumentsError(
                f"progress metadata is {size:,} bytes of JSON, over {PROGRESS_META_MAX_BYTES:,}"
            )
        checked_json(self.task, {"message": message, "meta": meta})
        if self.progress is not None:
            report = {
                "fraction": fraction,
                "message": message,
                "meta": meta,
                "at": datetime.now(timezone.utc).isoformat(),
            }
            self.progress.set(report)

    def step(self, name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run `fn(*args, **kwargs)` once as the step `name`, and return its result as
        recorded: the JSON it gave back (so return JSON: dicts, lists, strings, numbers,
        booleans, None). When the job runs again (a retry, a rescue, the end of a sleep),
        each step already recorded returns its recorded result without running again.

        Steps are told apart by their order: the n-th step the handler reaches must have the
        name the n-th one had when recorded, or the job fails with StepMismatchError. Code
        between steps runs again on every replay, so keep it deterministic: anything that
        varies (a clock, a random value, a call to another system) belongs in a step.

        A lease job's step is recorded in a transaction of its own right after `fn` returns:
        `fn` runs at least once, and never again once its record committed. An atomic job's
        step commits with what the handler wrote on `ctx.connection` since the previous step
        (fn's writes included): exactly once. Not inside your own transaction block on
        `ctx.connection`: the step commits. For `def` handlers; `astep` in `async def` ones."""
        return typing.cast(R, self._durable().step(name, fn, args, kwargs))

    async def astep(
        self, name: str, fn: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`step` for an `async def` handler: `fn` is an async function, awaited once."""
        return typing.cast(R, await self._durable().astep(name, fn, args, kwargs))

    def sleep(self, duration: timedelta | float, *, name: str = "sleep") -> None:
        """Sleep durably for `duration` (seconds or a timedelta): the sleep's end is recorded
        as a step and the job gives back its slot (raising a Snooze: let it propagate; no
        attempt is spent, no worker slot or connection held). When it ends the job runs
        again, replays its recorded steps and goes on after this call."""
        self._durable().sleep(duration, name)

    async def asleep(self, duration: timedelta | float, *, name: str = "sleep") -> None:
        """`sleep` for an `async def` handler."""
        await self._durable().asleep(duration, name)

    def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """`sleep` until `when`, a timezone-aware datetime."""
        self._durable().sleep_until(when, name)

    async def asleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """`sleep_until` for an `async def` handler."""
        await self._durable().asleep_until(when, name)

    def wait_for_signal(
        self, key: str, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """The payload of a signal sent for `key` (Queue.signal), taken once and recorded as
        a step named `name` (the key by default), so a replay returns the same payload.

        A signal sent before the job waits is kept for it. When none is there yet, the job
        parks (raising a Snooze: let it propagate), holding no worker slot, until a signal
        for the key arrives, which wakes it, or `timeout` (seconds or a timedelta; None waits
        as long as it takes) passes, after which this raises SignalTimeoutError, which the
        handler may catch; the timeout is recorded too. Cancelling a parked job ends it."""
        return self._durable().wait_for_signal(key, timeout, name)

    async def await_for_signal(
        self, key: str, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """`wait_for_signal` for an `async def` handler."""
        return await self._durable().await_for_signal(key, timeout, name)

    def _durable(self) -> Steps:
        if self.durable is None:
            raise ConfigurationError(
                "durable calls (ctx.step, ctx.sleep, ctx.wait_for_signal) run inside a "
                "worker: this JobContext was made without one"
            )
        return self.durable

    @property
    def cancel_requested(self) -> bool:
        """True once cancellation of this job was requested (Queue.cancel_job): a `def`
        handler should return soon; the job then ends as cancelled. An `async def` handler
        need not look: it is cancelled (CancelledError at its next await)."""
        return self.cancel is not None and self.cancel.requested


class CancelSignal:
    """Set by the worker when this job's cancellation is requested; read from any thread."""

    def __init__(self) -> None:
        self.requested = False
        self._waiters: list[Callable[[], object]] = []

    def request(self) -> None:
        if not self.requested:
            self.requested = True
            for waiter in self._waiters:
                waiter()

    def on_request(self, callback: Callable[[], object]) -> None:
        """Call `callback` (on the worker's event loop) when cancellation is requested, or at
        once if it already was."""
        if self.requested:
            callback()
        else:
            self._waiters.append(callback)


# Fills a NewJob's slots directly: the frozen dataclass's __init__ goes through
# object.__setattr__ once per field, and bulk enqueue builds thousands. The result is the same
# frozen dataclass (tests/unit/test_plain_args.py).
_SET_TASK, _SET_ARGS, _SET_OPTIONS, _SET_ATOMIC = (
    getattr(NewJob, name).__set__ for name in ("task", "args", "options", "atomic")
)


def _new_job(task: str, args: dict[str, Any], options: JobOptions, atomic: bool) -> NewJob:
    if options.limits is not None or options.fairness_key is not None:
        options = resolve_keys(task, options, args)
    job = object.__new__(NewJob)
    _SET_TASK(job, task)
    _SET_ARGS(job, args)
    _SET_OPTIONS(job, options)
    _SET_ATOMIC(job, atomic)
    return job


class Task(Generic[P, R]):
    """A registered handler. Calling it runs the function now; `job()` builds a job for later.

    Tasks come from `Queue.task` / `AsyncQueue.task`, which also give them `enqueue`. For a
    type checker a task is `Task[P, R]`: `P` the handler's parameters, which `__call__`,
    `job`, `enqueue` and `with_options(...).job/enqueue` take, and `R` what the handler
    returns, which `__call__` returns (for an `async def` handler, the coroutine, as calling
    the function does). `job` and `enqueue` give a `NewJob[T]` and an `Enqueued[T]`, T being
    R awaited, which `queue.wait(...)` returns. A handler whose first parameter is a
    JobContext gives a `Task[P, R]` whose `P` is the parameters after it: the worker passes
    the context, jobs carry the rest. A task declared by name (`queue.declare`) is a
    `Task[..., Any]`. An AsyncQueue's tasks are `AsyncTask[P, R]`, whose `enqueue` is awaited.
    """

    def __init__(
        self,
        fn: Callable[P, R] | None,
        *,
        name: str,
        options: JobOptions,
        policy: TaskPolicy,
        atomic: bool = False,
    ) -> None:
        self.fn = fn
        self.name = check_identifier("task", name, TASK_NAME)
        self.options = options
        self.policy = policy
        self.atomic = atomic
        self.is_async = fn is not None and inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn) if fn is not None else None
        if options.limits is not None or options.fairness_key is not None:
            params = None if self._signature is None else list(self._signature.parameters)
            check_templates(self.name, templated(options), params)
        self._context_param: str | None = None
        self._model = _argument_model(self) if fn is not None else None
        self._plain = _plain_fields(self) if fn is not None else None
        self._job_signature = _job_signature(self._signature, self._context_param)
        self._models_without: dict[str, type[BaseModel]] = {}
        self.enqueuer: Callable[[NewJob], Any] | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.fn is None:
            raise UnknownTaskError(f"task {self.name!r} is declared here but defined elsewhere")
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.options.queue}>"

    # Each pair of overloads below gives a coroutine handler's jobs the awaited type; its
    # first one never matches a `def` handler's task, so mypy reports that task's wrong
    # arguments as for a plain method.
    @overload
    def enqueue(
        self: Task[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> Enqueued[T]: ...
    @overload
    def enqueue(self: Task[P, T], *args: P.args, **kwargs: P.kwargs) -> Enqueued[T]: ...

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Enqueue on the owning queue's own connection and commit; returns the job id (an
        `Enqueued`: an int that also says whether it was `created` or deduplicated).

        For an AsyncQueue's task this returns an awaitable. Inside your own transaction use
        `queue.enqueue(task.job(...), conn=conn)` instead; or give the queue your framework's
        connection with `queue.use_connection(...)` (pgqueue.contrib.django does), and this
        joins that connection's transaction instead of committing.
        """
        return _enqueuer(self)(self.job(*args, **kwargs))

    @overload
    def job(
        self: Task[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> NewJob[T]: ...
    @overload
    def job(self: Task[P, T], *args: P.args, **kwargs: P.kwargs) -> NewJob[T]: ...

    def job(self, *args: Any, **kwargs: Any) -> NewJob[Any]:
        """Validate arguments as a call would and return a job carrying them as JSON."""
        return _new_job(self.name, self.dump_args(args, kwargs), self.options, self.atomic)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A workflow step that receives the result of what it waits for (pgqueue.chain,
        pgqueue.chord) in its first parameter these arguments leave out. Its arguments are
        validated when the workflow is built; use `job()` for a step that takes no result.

        Its arguments stay untyped (`Any`) for a type checker, unlike `job()`'s: the step
        takes the handler's parameters minus one that may sit anywhere (the first these
        arguments leave out, decided by how many are given by position and which by name),
        and a type can only drop a parameter from the front (`Concatenate`). Typed, a step
        receiving into its first parameter would be right and any other refused."""
        return Signature(self, args, kwargs, self.options)

    def with_options(self, **options: Unpack[EnqueueOptions]) -> NewJobFactory[P, R]:
        """Same task, other job options (queue, priority, delay, run_at, max_attempts,
        dedupe_key, dedupe_window, concurrency_key, limits, fairness_key, tags)."""
        return NewJobFactory(self, self.options.merged(dict(options)))

    def receiving_param(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The parameter a workflow step's result goes into: the first one that these
        arguments leave out (not the JobContext)."""
        if self._signature is None:
            raise InvalidArgumentsError(
                f"task {self.name!r} is declared without a function: a workflow step that "
                "receives a result needs the function's parameters; use .job(...)"
            )
        given = set(kwargs)
        names = [
            p.name for p in self._signature.parameters.values() if p.name != self._context_param
        ]
        given.update(names[: len(args)])
        for name in names:
            if name not in given:
                return name
        raise InvalidArgumentsError(
            f"task {self.name!r}: these arguments leave no parameter free to receive the "
            "result of the step before it; use .job(...) for a step that takes no result"
        )

    def dump_args(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], *, leave_out: str | None = None
    ) -> dict[str, Any]:
        """The arguments validated and dumped to JSON; `leave_out` names a parameter whose
        value comes later (a workflow step's result), validated only when the job runs."""
        if self._plain is not None and leave_out is None:
            plain = self._plain.dump(args, kwargs)
            if plain is not None:
                return plain
        if self._signature is None or self._model is None:
            if args or not _is_json_object(kwargs):
                raise InvalidArgumentsError(
                    f"task {self.name!r} is declared without a function: pass its arguments "
                    "as keywords with JSON values"
                )
            return checked_json(self.name, kwargs)
        later = {} if leave_out is None else {leave_out: None}
        assert self._job_signature is not None
        try:
            bound = self._job_signature.bind(*args, **(kwargs | later))
        except TypeError as exc:
            raise InvalidArgumentsError(f"task {self.name!r}: {exc}") from None
        values = {k: v for k, v in bound.arguments.items() if k != leave_out}
        try:
            model = self._model_without(leave_out).model_validate(values)
            dumped = model.model_dump(mode="json", exclude_unset=True)
        except ValidationError as exc:
            raise InvalidArgumentsError(f"task {self.name!r}: invalid arguments: {exc}") from None
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise InvalidArgumentsError(
                f"task {self.name!r}: arguments are not JSON-serialisable: {exc}"
            ) from None
        return checked_json(self.name, dumped)

    def _model_without(self, leave_out: str | None) -> type[BaseModel]:
        """The argument model, or one without the parameter `leave_out` (made once)."""
        assert self._model is not None
        if leave_out is None:
            return self._model
        model = self._models_without.get(leave_out)
        if model is None:
            fields: dict[str, Any] = {
                name: (field.annotation, field)
                for name, field in self._model.model_fields.items()
                if name != leave_out
            }
            model = create_model(
                f"{self.name}:args-{leave_out}", __config__=self._model.model_config, **fields
            )
            self._models_without[leave_out] = model
        return model

    @property
    def takes_context(self) -> bool:
        """Whether the handler has a JobContext parameter."""
        return self._context_param is not None

    def load_args(
        self, stored: dict[str, Any], context: JobContext | None
    ) -> tuple[list[Any], dict[str, Any]]:
        """Stored JSON args -> (positional, keyword) call arguments of the declared types.
        `context` may be None only for a task that does not take it."""
        if self._plain is not None:
            plain = self._plain.load(stored, context)
            if plain is not None:
                return plain
        assert self._signature is not None and self._model is not None
        try:
            model = self._model.model_validate(stored)
        except ValidationError as exc:
            raise InvalidArgumentsError(
                f"task {self.name!r}: stored arguments no longer validate: {exc}"
            ) from None
        given: list[tuple[inspect.Parameter, Any]] = []
        for param in self._signature.parameters.values():
            if param.name == self._context_param:
                given.append((param, context))
            elif param.name in model.model_fields_set or param.default is param.empty:
                given.append((param, getattr(model, param.name)))
        return _call_args(given)


class AsyncTask(Task[P, R]):
    """A task of an AsyncQueue: the same as a Task, but its `enqueue` is a coroutine."""

    # Task.enqueue returns the id; here it is a coroutine giving the id. The two differ only
    # in what a type checker sees: at run time each calls its queue's own enqueue.
    @overload  # type: ignore[override]
    def enqueue(
        self: AsyncTask[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, Enqueued[T]]: ...
    @overload
    def enqueue(
        self: AsyncTask[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> Coroutine[Any, Any, Enqueued[T]]: ...

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Enqueue on the owning queue's own connection and commit: await it for the job id
        (an `Enqueued`), as Task.enqueue returns it."""
        return _enqueuer(self)(self.job(*args, **kwargs))


@dataclass(frozen=True)
class NewJobFactory(Generic[P, R]):
    """A task with overridden job options; `job()` validates as Task.job does."""

    task: Task[P, R]
    options: JobOptions

    @overload
    def job(
        self: NewJobFactory[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> NewJob[T]: ...
    @overload
    def job(self: NewJobFactory[P, T], *args: P.args, **kwargs: P.kwargs) -> NewJob[T]: ...

    def job(self, *args: Any, **kwargs: Any) -> NewJob[Any]:
        return _new_job(
            self.task.name, self.task.dump_args(args, kwargs), self.options, self.task.atomic
        )

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Like Task.enqueue, with these options: `task.with_options(delay=60).enqueue(x)`."""
        return _enqueuer(self.task)(self.job(*args, **kwargs))

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """Like Task.s, with these options (and as untyped, for the same reason)."""
        return Signature(self.task, args, kwargs, self.options)


@dataclass(frozen=True)
class Signature:
    """A task call for a workflow (pgqueue.chain, pgqueue.chord) that receives the result of
    what it waits for, as Celery's `task.s(...)`: the result goes into the task's first
    parameter the arguments leave out. Made by `task.s(...)`."""

    task: Task[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: JobOptions

    def job(self, receives: bool) -> tuple[NewJob, str | None]:
        """The validated job, and the parameter its result goes into (None: it receives none,
        having nothing to wait for)."""
        if not receives:
            args = self.task.dump_args(self.args, self.kwargs)
            return _new_job(self.task.name, args, self.options, self.task.atomic), None
        param = self.task.receiving_param(self.args, self.kwargs)
        args = self.task.dump_args(self.args, self.kwargs, leave_out=param)
        return _new_job(self.task.name, args, self.options, self.task.atomic), param


def _enqueuer(task: Task[..., Any]) -> Callable[[NewJob], Any]:
    if task.enqueuer is None:
        raise ConfigurationError(f"task {task.name!r} is not registered on a queue")
    return task.enqueuer


@dataclass(frozen=True)
class Discovered:
    """What a registry's fallback can run, found ahead of any job naming it."""

    tasks: Mapping[str, str] = field(default_factory=dict)
    """Task name: the queue its jobs go on unless their enqueue names another."""
    queues: frozenset[str] = frozenset()
    """Other queues the integration lets jobs go on, whether or not a task names them."""


class Registry:
    """The tasks a process knows. A worker runs only these."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[..., Any]] = {}
        self._found_by_fallback: set[str] = set()
        self.fallback: Callable[[str], Task[..., Any] | None] | None = None
        """Asked for a name no task is registered under: how an integration whose tasks are
        registered elsewhere (pgqueue.contrib.django's django.tasks backend) hands the worker
        the task, or None. What it returns is kept, so it is asked once per name."""
        self.discover: Callable[[], Discovered] | None = None
        """Says ahead of any job what `fallback` would find, so that `--queues all` serves
        those tasks' queues and a worker warns of those it does not serve."""

    def add(self, task: Task[..., Any]) -> None:
        if task.name in self._tasks:
            raise ConfigurationError(
                f"task name {task.name!r} is registered twice; pass name= to tell them apart"
            )
        self._tasks[task.name] = task

    def get(self, name: str) -> Task[..., Any]:
        try:
            return self._tasks[name]
        except KeyError:
            found = self.fallback(name) if self.fallback is not None else None
            if found is not None:
                self._tasks.setdefault(name, found)
                self._found_by_fallback.add(name)
                return self._tasks[name]
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTaskError(
                f"no task is registered under {name!r} (registered: {known})"
            ) from None

    def __iter__(self) -> Iterator[Task[..., Any]]:
        return iter(self._tasks.values())

    def discovered(self) -> Discovered:
        """What the fallback can run, as `discover` finds it now (nothing without one)."""
        return self.discover() if self.discover is not None else Discovered()

    def queues(self) -> list[str]:
        """Every queue the application names, sorted: "default", its tasks' and the
        fallback's. What a worker given `--queues all` serves."""
        found = self.discovered()
        named = (task.options.queue for task in self)
        return sorted({"default", *named, *found.tasks.values(), *found.queues})

    def queue_of_each_task(self) -> dict[str, str]:
        """Task name: its jobs' queue, for the tasks registered with a handler and those
        the fallback can run. A handler the fallback gave is left to `discover`: its
        options hold no queue, since the integration names one at each enqueue."""
        own = {
            task.name: task.options.queue
            for task in self
            if task.fn is not None and task.name not in self._found_by_fallback
        }
        return own | dict(self.discovered().tasks)

    def declarations(self) -> list[TaskDeclaration]:
        """What the tasks with a handler here declare, for enqueue() in SQL. A task declared
        by name (`queue.declare`) is defined elsewhere: the process that runs it owns its
        declaration. Nor is a handler the fallback gave: its integration names the queue at
        each enqueue, so its options declare none."""
        return [
            TaskDeclaration(task.name, task.options, task.policy, task.atomic)
            for task in self._tasks.values()
            if task.fn is not None and task.name not in self._found_by_fallback
        ]

    def __len__(self) -> int:
        return len(self._tasks)


def derived_name(fn: Callable[..., Any]) -> str:
    """module.qualname; refused for a script run as __main__, whose tasks no worker can name."""
    if fn.__module__ == "__main__":
        raise ConfigurationError(
            f"task {fn.__qualname__!r} is defined in a script run as __main__: give it an "
            "explicit name= (a derived name would be '__main__.…', which no worker knows)"
        )
    return f"{fn.__module__}.{fn.__qualname__}".replace("<locals>.", "")


def _argument_model(task: Task[..., Any]) -> type[BaseModel]:
    assert task.fn is not None and task._signature is not None
    try:
        hints = typing.get_type_hints(task.fn)
    except Exception as exc:
        raise ConfigurationError(f"task {task.name!r}: cannot resolve annotations: {exc}") from exc
    fields: dict[str, Any] = {}
    for param in task._signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"task {task.name!r}: *args and **kwargs cannot be stored; name each parameter"
            )
        annotation = hints.get(param.name, Any)
        if annotation is JobContext:
            task._context_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    # Non-finite floats stay floats when dumped, so the strict JSON check refuses them: the
    # default would store them as null without a word.
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, ser_json_inf_nan="constants")
    return create_model(f"{task.name}:args", __config__=config, **fields)


_PLAIN_TYPES = (int, str, float, bool)


@dataclass(frozen=True)
class _PlainFields:
    """The fast path for tasks whose parameters are all int, str, float or bool.

    Values of exactly the declared type are what pydantic would validate and dump unchanged,
    so they skip it, in both directions, keeping pydantic off the per-job hot path.
    Anything else (another type, a missing or unknown argument, a non-finite float, a string
    jsonb cannot store) returns None and goes the validated way, which gives the same result
    or raises the same error: tests/unit/test_registry.py compares the two paths.
    """

    # Each parameter in order as (name, its type, or None for the context, whether it is
    # passed by position): read once per job, where inspect.Parameter's properties cost.
    loads: tuple[tuple[str, type | None, bool], ...]
    types: dict[str, type]
    positional: tuple[str, ...]
    positional_only: frozenset[str]
    required: frozenset[str]
    context: str | None
    # The types of `positional`, in order, when a call giving each of them by position and
    # no keywords is complete (no context, no required keyword-only parameter); else None.
    by_position: tuple[type, ...] | None
    check_values: bool  # some parameter is a str or a float: its value needs _plain_value

    def dump(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        kinds = self.by_position
        if kinds is not None and not kwargs and tuple(map(type, args)) == kinds:
            # The common call, `task.job(a, b)`, with values of exactly the declared types.
            # The types matched, so the lengths are equal: no need for zip's strict=.
            if self.check_values and not all(map(_plain_value, kinds, args)):
                return None
            return dict(zip(self.positional, args))  # noqa: B905
        if self.context is not None or len(args) > len(self.positional):
            return None
        out = dict(zip(self.positional, args, strict=False))
        for name, value in kwargs.items():
            if name in out or name in self.positional_only or name not in self.types:
                return None
            out[name] = value
        if not self.required <= out.keys():
            return None
        types = self.types
        for name, value in out.items():  # a loop, not all(...): a quarter of a job's build
            if not _plain_value(types[name], value):
                return None
        return out

    def load(
        self, stored: dict[str, Any], context: JobContext | None
    ) -> tuple[list[Any], dict[str, Any]] | None:
        if not stored.keys() <= self.types.keys() or not self.required <= stored.keys():
            return None
        positional: list[Any] = []
        keyword: dict[str, Any] = {}
        for name, kind, by_position in self.loads:
            if kind is None:
                value: Any = context
            elif name in stored:
                value = stored[name]
                if not _plain_value(kind, value):
                    return None
            else:
                continue
            if by_position:
                positional.append(value)
            else:
                keyword[name] = value
        return positional, keyword


def _call_args(given: list[tuple[inspect.Parameter, Any]]) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments: positional-only parameters by position, the others by name."""
    positional: list[Any] = []
    keyword: dict[str, Any] = {}
    for param, value in given:
        if param.kind is param.POSITIONAL_ONLY:
            positional.append(value)
        else:
            keyword[param.name] = value
    return positional, keyword


def _plain_value(kind: type, value: Any) -> bool:
    if type(value) is not kind:
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return "\x00" not in value and (value.isascii() or is_utf8(value))
    return True


def _plain_fields(task: Task[..., Any]) -> _PlainFields | None:
    """The fast path's view of a task, or None if some parameter is not a plain type."""
    assert task._signature is not None and task.fn is not None
    hints = typing.get_type_hints(task.fn)
    params = tuple(task._signature.parameters.values())
    types: dict[str, type] = {}
    for param in params:
        if param.name == task._context_param:
            continue
        annotation = hints.get(param.name)
        if annotation not in _PLAIN_TYPES:
            return None
        types[param.name] = annotation
    kept = [p for p in params if p.name != task._context_param]
    positional = tuple(p.name for p in kept if p.kind is not p.KEYWORD_ONLY)
    required = frozenset(p.name for p in kept if p.default is p.empty)
    complete = task._context_param is None and required <= set(positional)
    return _PlainFields(
        loads=tuple((p.name, types.get(p.name), p.kind is p.POSITIONAL_ONLY) for p in params),
        types=types,
        positional=positional,
        positional_only=frozenset(p.name for p in kept if p.kind is p.POSITIONAL_ONLY),
        required=required,
        context=task._context_param,
        by_position=tuple(types[name] for name in positional) if complete else None,
        check_values=any(kind is str or kind is float for kind in types.values()),
    )


def _job_signature(
    signature: inspect.Signature | None, context: str | None
) -> inspect.Signature | None:
    """The parameters a job's arguments bind to: the handler's, less its JobContext, which
    the worker passes. So arguments by position skip the context wherever it sits, as the
    task's type (`Task[P, R]`, P the parameters after a leading context) says they do."""
    if signature is None or context is None:
        return signature
    kept = [p for p in signature.parameters.values() if p.name != context]
    return signature.replace(parameters=kept)


def _is_json_object(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)
