"""What the twins `Queue` and `AsyncQueue` share: settings, the task registry, the task and
recurring job decorators, and each call's plan (plans.py). Each twin is a few lines per
method on top."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, overload

import psycopg
from typing_extensions import TypeVar

from pgqueue import dsn as dsn_rule
from pgqueue.errors import (
    ConfigurationError,
)
from pgqueue.hooks import EnqueueHook, enqueue_hooks
from pgqueue.models import (
    JobOptions,
    Missed,
    NewJob,
    OnLost,
    QueueSettings,
    RetryPolicy,
    TaskPolicy,
    duration,
)
from pgqueue.queries import Migration, channel
from pgqueue.queue.arguments import _atomic_timeout
from pgqueue.queue.plans import Plans
from pgqueue.registry import AsyncTask, EnqueueOptions, JobContext, Registry, Task, derived_name
from pgqueue.schedule import RecurringJob, Schedules
from pgqueue.tenants import (
    check_keyed_atomic,
    resolve_keys,
)

P = ParamSpec("P")
R = TypeVar("R")
# A job's result type; Any where nothing says it (a job enqueued by task name), so that
# `queue.enqueue("name")` is an Enqueued[Any], not an Enqueued[Never].
T = TypeVar("T", default=Any)
TaskT = TypeVar("TaskT", bound=Task[Any, Any])

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session
    from typing_extensions import TypedDict, Unpack

    # What conn= takes: a psycopg connection, or a SQLAlchemy session or connection on the
    # psycopg driver (pgqueue/contrib/sqlalchemy.py), whose open transaction the job joins.
    Conn = psycopg.Connection[Any] | Session | SAConnection
    AsyncConn = psycopg.AsyncConnection[Any] | AsyncSession | SAAsyncConnection

    class _TaskOptions(TypedDict, total=False):
        """The options of `@queue.task(...)`, for its overloads; see the method."""

        name: str | None
        queue: str
        priority: int
        max_attempts: int
        delay: timedelta | float | None
        retry: RetryPolicy | None
        timeout: timedelta | float | None
        on_lost: OnLost
        compensate_with: str | None
        atomic: bool
        dedupe_window: timedelta | float | None
        concurrency_key: str | None
        limits: Sequence[str] | None
        fairness_key: str | None
        shard_key: str | None
        tags: Sequence[str] | None

    # A handler whose first parameter is a JobContext is a Task[P, R] of the parameters
    # after it (_ContextFirst). One with a JobContext after up to five others, where handlers
    # put it, is called with the context but its jobs are built without it, and one
    # ParamSpec cannot say both: such a task's arguments stay untyped (Task[..., R]).
    _ContextFirst = Callable[Concatenate[JobContext, P], R]
    _WithContext = (
        Callable[Concatenate[Any, JobContext, ...], R]
        | Callable[Concatenate[Any, Any, JobContext, ...], R]
        | Callable[Concatenate[Any, Any, Any, JobContext, ...], R]
        | Callable[Concatenate[Any, Any, Any, Any, JobContext, ...], R]
        | Callable[Concatenate[Any, Any, Any, Any, Any, JobContext, ...], R]
    )

    class _PeriodicOptions(TypedDict, total=False):
        """The options of `queue.periodic(...)`, for its overloads; see the method."""

        cron: str | None
        every: timedelta | float | None
        timezone: str
        args: dict[str, Any] | None
        name: str | None
        missed: Missed
        grace: timedelta | float | None


JobRef = NewJob | str | Task[..., Any]


class _Scheduling(Protocol):
    """What `@queue.periodic(...)` returns: it schedules the task (or function) it decorates."""

    @overload
    def __call__(self, target: TaskT, /) -> TaskT: ...
    @overload
    def __call__(self, target: _ContextFirst[P, R], /) -> Task[P, R]: ...
    @overload
    def __call__(self, target: _WithContext[R], /) -> Task[..., R]: ...
    @overload
    def __call__(self, target: Callable[P, R], /) -> Task[P, R]: ...


class _Registering(Protocol):
    """What `@queue.task(...)` with options returns: it registers the function it decorates,
    keeping its parameters and return type."""

    @overload
    def __call__(self, fn: _ContextFirst[P, R], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: _WithContext[R], /) -> Task[..., R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class _AsyncScheduling(Protocol):
    """`_Scheduling` for an AsyncQueue, whose tasks are AsyncTasks."""

    @overload
    def __call__(self, target: TaskT, /) -> TaskT: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, target: _ContextFirst[P, R], /) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, target: _WithContext[R], /) -> AsyncTask[..., R]: ...
    @overload
    def __call__(self, target: Callable[P, R], /) -> AsyncTask[P, R]: ...


class _AsyncRegistering(Protocol):
    """`_Registering` for an AsyncQueue, whose tasks are AsyncTasks."""

    @overload
    def __call__(self, fn: _ContextFirst[P, R], /) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, fn: _WithContext[R], /) -> AsyncTask[..., R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> AsyncTask[P, R]: ...


class _Base(Plans, abc.ABC):
    """What the twins share: settings, registry, tasks and recurring jobs; their statements'
    plans (Plans)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "pgqueue",
        keep_history: bool = True,
        max_payload_bytes: int = 10 * 1024 * 1024,
        prepare: bool = True,
        hooks: Sequence[EnqueueHook] = (),
    ) -> None:
        """`dsn` is for the queue's own pooled connection, used when a call gets no `conn=`,
        and the database a worker of this application uses unless told another. `prepare`
        False: no server-side prepared statements on that pool, for a dsn that goes through
        PgBouncer in transaction pooling mode. Without `dsn`, PGQUEUE_DSN, else DATABASE_URL,
        read now (pgqueue.dsn: the rule the `pgqueue` command follows too). `hooks`: enqueue
        hooks (pgqueue.hooks.EnqueueHook) around this queue's enqueues only, inside those
        registered for the whole process (hooks.register)."""
        self.dsn = dsn_rule.resolve(dsn)
        self.settings = QueueSettings(
            schema=schema,
            keep_history=keep_history,
            max_payload_bytes=max_payload_bytes,
            prepare=prepare,
        )
        self.registry = Registry()
        self.periodics = Schedules()
        self.enqueue_hooks = enqueue_hooks(hooks)

    def _pool_options(self) -> dict[str, Any]:
        """Connection options of the queue's own pool."""
        return {} if self.settings.prepare else {"prepare_threshold": None}

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel workers of this schema wake on."""
        return channel(self.schema)

    # The task class each twin makes: its tasks' `enqueue` is the twin's own.
    _task_class: type[Task[Any, Any]] = Task

    @overload
    def task(self, fn: _ContextFirst[P, R], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: _WithContext[R], /) -> Task[..., R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    @overload
    def task(self, /, **options: Unpack[_TaskOptions]) -> _Registering: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 25,
        delay: timedelta | float | None = None,
        retry: RetryPolicy | None = None,
        timeout: timedelta | float | None = None,
        on_lost: OnLost = "retry",
        compensate_with: str | None = None,
        atomic: bool = False,
        dedupe_window: timedelta | float | None = None,
        concurrency_key: str | None = None,
        limits: Sequence[str] | None = None,
        fairness_key: str | None = None,
        shard_key: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> Any:
        """Register a handler, `def` or `async def`, as a task.

        The options are the defaults of its jobs; each enqueue may override them. The name
        defaults to module.qualname: give one explicitly if the function may move, because
        stored jobs refer to tasks by name. `timeout` stops a job that runs longer; `on_lost`
        says what happens to a job whose worker died. `atomic=True` runs claim, handler and
        completion in one transaction; it bounds the job's time (default 60 s, at most 15
        min). `dedupe_window` applies to jobs enqueued with a dedupe_key. `concurrency_key`
        caps how many jobs with that key run at once; `limits` are more such keys, each with its
        own limit, or templates of them formatted from each job's arguments
        ("tenant:{tenant_id}"); a job starts when all its keys have room. Atomic tasks take
        no key. `fairness_key` (also a template) shares the queue's starts fairly between
        keys, by their weights (set_fairness_weight). `shard_key` (also a template) places
        its jobs on a Citus cluster (pgqueue.citus); plain PostgreSQL ignores it. `tags`
        label its jobs, for list_jobs(tag=...).
        """
        options = JobOptions(
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            delay=duration(delay, "delay"),
            dedupe_window=duration(dedupe_window, "dedupe_window"),
            concurrency_key=concurrency_key,
            limits=None
            if limits is None
            else tuple([limits] if isinstance(limits, str) else limits),
            fairness_key=fairness_key,
            shard_key=shard_key,
            tags=None if tags is None else tuple([tags] if isinstance(tags, str) else tags),
        )
        if atomic:
            check_keyed_atomic(name or "this atomic task", options)
        timeout = duration(timeout, "timeout")
        if atomic:
            timeout = _atomic_timeout(timeout)
        policy = TaskPolicy(
            retry=retry or RetryPolicy(),
            timeout=timeout,
            on_lost=on_lost,
            compensate_with=compensate_with,
        )

        def register(func: Callable[..., Any]) -> Task[..., Any]:
            task = self._task_class(
                func,
                name=derived_name(func) if name is None else name,
                options=options,
                policy=policy,
                atomic=atomic,
            )
            task.enqueuer = self._enqueue_task(task)
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    def declare(
        self, name: str, *, atomic: bool = False, **options: Unpack[EnqueueOptions]
    ) -> Task[..., Any]:
        """Declare a task another service defines, so this one can enqueue it by name.

        Pass atomic=True if the defining service registered it as atomic: the flag travels
        with each job and decides how workers claim it."""
        given: dict[str, Any] = dict(options)
        task: Task[..., Any] = self._task_class(
            None, name=name, options=JobOptions(**given), policy=TaskPolicy(), atomic=atomic
        )
        task.enqueuer = self._enqueue_task(task)
        self.registry.add(task)
        return task

    # A task is callable too: the first overload keeps its class (and its typed enqueue).
    @overload
    def periodic(self, task: TaskT, /, **options: Unpack[_PeriodicOptions]) -> TaskT: ...
    @overload
    def periodic(
        self, task: _ContextFirst[P, R], /, **options: Unpack[_PeriodicOptions]
    ) -> Task[P, R]: ...
    @overload
    def periodic(
        self, task: _WithContext[R], /, **options: Unpack[_PeriodicOptions]
    ) -> Task[..., R]: ...
    @overload
    def periodic(
        self, task: Callable[P, R], /, **options: Unpack[_PeriodicOptions]
    ) -> Task[P, R]: ...
    @overload
    def periodic(self, task: str, /, **options: Unpack[_PeriodicOptions]) -> Task[..., Any]: ...
    @overload
    def periodic(
        self, task: None = None, /, **options: Unpack[_PeriodicOptions]
    ) -> _Scheduling: ...

    def periodic(
        self,
        task: Task[..., Any] | Callable[..., Any] | str | None = None,
        /,
        *,
        cron: str | None = None,
        every: timedelta | float | None = None,
        timezone: str = "UTC",
        args: dict[str, Any] | None = None,
        name: str | None = None,
        missed: Missed = "skip",
        grace: timedelta | float | None = None,
    ) -> Any:
        """Run a task on a schedule: `@queue.periodic(cron="*/5 * * * *")` above `@queue.task`,
        or `queue.periodic(task, every=timedelta(minutes=5), args={...}, name=...)`.

        Every worker of this application schedules it; each tick becomes one job, exactly
        once. `args` are validated now, like an enqueue's. `missed` ("skip" or "run_once")
        says what happens to ticks no worker enqueued within `grace` (default 1 min, at most
        `every`). A plain function is registered as a task with default options first.
        Returns the task.
        """
        every = duration(every, "every")
        grace = duration(grace, "grace")

        def register(target: Task[..., Any] | Callable[..., Any] | str) -> Task[..., Any]:
            if isinstance(target, str):
                found: Task[..., Any] = self.registry.get(target)
            else:
                found = target if isinstance(target, Task) else self.task(target)
            job = found.job(**(args or {}))
            definition = RecurringJob(
                name=name or found.name,
                task=found.name,
                args=job.args,
                cron=cron,
                every=every,
                timezone=timezone,
                missed=missed,
                grace=grace,
            )
            self.periodics.add(definition, job)
            return found

        return register(task) if task is not None else register

    @abc.abstractmethod
    def _enqueue_task(self, task: Task[..., Any]) -> Callable[[NewJob], Any]:
        """The twin's enqueue for `task.enqueue(...)`: sync for Queue, async for AsyncQueue."""

    def _new_job(self, job: JobRef, args: dict[str, Any] | None, options: EnqueueOptions) -> NewJob:
        if isinstance(job, NewJob):
            if args is not None:
                raise ConfigurationError("pass args to task.job(...), not beside the job")
            if not options:
                return job
            merged = job.options.merged(dict(options))
            if options.get("limits") is not None or options.get("fairness_key") is not None:
                merged = resolve_keys(job.task, merged, job.args)  # templates given here
            return dataclasses.replace(job, options=merged)
        task = job if isinstance(job, Task) else self.registry.get(job)
        base = task.with_options(**options) if options else task
        return base.job(**(args or {}))


def _names(applied: list[Migration]) -> list[str]:
    return [f"{m.version:04d}_{m.name}" for m in applied]


def _document_twin(sync: type, twin: type) -> None:
    """Give each public method of `twin` the docstring of its `sync` namesake: the docs are
    written once, on Queue, and AsyncQueue's cannot drift from them (the twins test checks)."""
    for name, member in vars(twin).items():
        written = getattr(vars(sync).get(name), "__doc__", None)
        if not name.startswith("_") and written and not member.__doc__:
            member.__doc__ = written
