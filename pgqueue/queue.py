"""Enqueue and read jobs: `Queue` (sync) and `AsyncQueue`, twins with the same method names.

Owns: the task decorator and registry of one application, and the statements an application
runs. Every call takes an optional psycopg connection; given one, it runs inside whatever
transaction the caller has open and never commits or rolls back, so the job becomes visible to
workers exactly when the caller's data does, and vanishes with it on rollback. Without one,
the queue uses its own pooled connection and commits.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, Protocol, overload

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import ValidationError
from typing_extensions import TypeVar

from pgqueue import bulk, hooks, migrate, outcomes
from pgqueue import dsn as dsn_rule
from pgqueue.dsn import redact
from pgqueue.durable import signal_plan
from pgqueue.errors import (
    ConfigurationError,
    ConnectionLostError,
    DatabaseError,
    InvalidArgumentsError,
    JobNotFoundError,
)
from pgqueue.models import (
    ATOMIC_DEFAULT_TIMEOUT,
    ATOMIC_MAX_TIMEOUT,
    QUEUE_NAME,
    TASK_NAME,
    Cancellation,
    DeadMessage,
    Enqueued,
    EnqueuedWorkflow,
    Job,
    JobFilter,
    JobOptions,
    JobPage,
    JobStatus,
    JobSteps,
    Message,
    Missed,
    NewJob,
    OnLost,
    OutboxStats,
    QueuePause,
    QueueSettings,
    RateLimit,
    RetryPolicy,
    StatusName,
    TaskPolicy,
    Workflow,
    check_name,
    duration,
)
from pgqueue.outcomes import JobHandle, JobOutcome, WorkflowHandle
from pgqueue.queries import Migration, channel
from pgqueue.registry import AsyncTask, EnqueueOptions, JobContext, Registry, Task, derived_name
from pgqueue.schedule import RecurringJob, Schedules
from pgqueue.store import concurrency
from pgqueue.store import fairness as fairness_store
from pgqueue.store import jobs as jobs_store
from pgqueue.store import outbox as outbox_store
from pgqueue.store import queues as queues_store
from pgqueue.store import steps as steps_store
from pgqueue.store import tasks as tasks_store
from pgqueue.store import workflows as workflows_store
from pgqueue.store.plan import Plan, Step, run, run_async
from pgqueue.tenants import (
    ConcurrencyLimit,
    FairShare,
    check_keyed_atomic,
    limit_key,
    resolve_keys,
)
from pgqueue.waiting import STARTING, BackgroundWaiters, Waiters, WaitSettings, new_hub
from pgqueue.workflow import Flow, OnFailure, build

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

    class _JobFilters(TypedDict, total=False):
        """The filters of `list_jobs(...)`; see the method."""

        queue: str | None
        task: str | None
        concurrency_key: str | None
        tag: str | None
        workflow: int | None
        status: StatusName | JobStatus | Sequence[StatusName | JobStatus] | None
        created_after: datetime | None
        created_before: datetime | None
        before_id: int | None
        after_id: int | None
        limit: int

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


class _Base(abc.ABC):
    """What the twins share: settings, registry, statement building and row decoding."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "pgqueue",
        keep_history: bool = True,
        max_payload_bytes: int = 10 * 1024 * 1024,
        prepare: bool = True,
    ) -> None:
        """`dsn` is for the queue's own pooled connection, used when a call gets no `conn=`,
        and the database a worker of this application uses unless told another. `prepare`
        False: no server-side prepared statements on that pool, for a dsn that goes through
        PgBouncer in transaction pooling mode. Without `dsn`, PGQUEUE_DSN, else DATABASE_URL,
        read now (pgqueue.dsn: the rule the `pgqueue` command follows too)."""
        self.dsn = dsn_rule.resolve(dsn)
        self.settings = QueueSettings(
            schema=schema,
            keep_history=keep_history,
            max_payload_bytes=max_payload_bytes,
            prepare=prepare,
        )
        self.registry = Registry()
        self.periodics = Schedules()

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds this queue's tables and functions."""
        return self.settings.schema_name

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
        keys, by their weights (set_fairness_weight). `tags`
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

    # The statements and plans of each call, the same for both twins; each twin runs them.

    def _insert(self, batch: Sequence[NewJob], *, alone: bool = False) -> Step:
        return jobs_store.insert(batch, self.schema, self.settings.max_payload_bytes, alone=alone)

    def _enqueue_plan(self, batch: Sequence[NewJob]) -> Plan[list[Enqueued]]:
        return jobs_store.enqueue_plan(batch, self.schema, self.settings.max_payload_bytes)

    def _get_plan(self, job_id: int) -> Plan[Job | None]:
        return jobs_store.get_plan(_job_id(job_id), self.schema)

    def _steps_plan(self, job_id: int) -> Plan[JobSteps]:
        return steps_store.steps_plan(self.schema, _job_id(job_id))

    def _sync_plan(self) -> Plan[list[str]]:
        return tasks_store.sync_plan(self.schema, self.registry.declarations())

    def _list_plan(self, filters: _JobFilters) -> Plan[JobPage]:
        given: dict[str, Any] = dict(filters)
        return jobs_store.list_plan(JobFilter(**given), self.schema)

    def _cancel_plan(self, job_id: int) -> Plan[Cancellation]:
        return jobs_store.cancel_plan(_job_id(job_id), self.schema, self.settings.keep_history)

    def _retry_plan(self, job_id: int) -> Plan[Enqueued]:
        return jobs_store.retry_plan(_job_id(job_id), self.schema, self.settings.max_payload_bytes)

    def _set_limit_plan(self, key: str | None, max_running: int | None) -> Plan[None]:
        return concurrency.set_limit_plan(self.schema, key, max_running)

    def _limits_plan(self) -> Plan[list[ConcurrencyLimit]]:
        return concurrency.list_limits_plan(self.schema)

    def _weight_plan(self, key: str, weight: float | None) -> Plan[None]:
        return fairness_store.set_weight_plan(self.schema, key, weight)

    def _shares_plan(self, window: timedelta | float) -> Plan[list[FairShare]]:
        seconds = duration(window, "window")
        if seconds is None or seconds <= timedelta(0):
            raise ConfigurationError(f"window={window!r}: give a positive duration")
        return fairness_store.shares_plan(self.schema, seconds.total_seconds())

    def _pause_plan(self, queues: str | Sequence[str], reason: str) -> Plan[list[str]]:
        if not isinstance(reason, str) or len(reason) > 1000 or "\x00" in reason:
            raise ConfigurationError("a pause's reason is a string of at most 1000 characters")
        return queues_store.pause_plan(self.schema, _queue_names(queues), reason)

    def _stage_plan(self, messages: Iterable[Message]) -> Plan[list[int]]:
        batch = list(messages)
        return outbox_store.insert_plan(self.schema, batch, self.settings.max_payload_bytes)

    def _dead_plan(self, limit: int) -> Plan[list[DeadMessage]]:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit is a whole number from 1 to 1000, got {limit!r}")
        return outbox_store.dead_plan(self.schema, limit)

    def _retry_messages_plan(self, ids: Sequence[int] | None) -> Plan[int]:
        checked = None if ids is None else [_message_id(i) for i in ids]
        return outbox_store.retry_plan(self.schema, checked)

    def _resume_plan(self, queues: str | Sequence[str]) -> Plan[list[str]]:
        return queues_store.resume_plan(self.schema, _queue_names(queues))

    def _paused_plan(self) -> Plan[list[QueuePause]]:
        return queues_store.paused_plan(self.schema)

    def _set_rate_plan(
        self, queue: str, limit: int | str | None, per: timedelta | float | None
    ) -> Plan[Any]:
        if not isinstance(queue, str):
            raise ConfigurationError(f"set_rate_limit takes one queue name, got {queue!r}")
        name = _queue_names(queue)[0]
        if limit is None:
            if per is not None:
                raise ConfigurationError("per= goes with a limit; pass None alone to remove it")
            return queues_store.remove_rate_plan(self.schema, name)
        max_starts, period = _rate(limit, per)
        return queues_store.set_rate_plan(self.schema, name, max_starts, period)

    def _set_job_rate_plan(
        self,
        kind: Literal["task", "key"],
        name: str,
        limit: int | str | None,
        per: timedelta | float | None,
    ) -> Plan[Any]:
        if limit is None:
            if per is not None:
                raise ConfigurationError("per= goes with a limit; pass None alone to remove it")
            return queues_store.remove_job_rate_plan(self.schema, kind, name)
        max_starts, period = _rate(limit, per)
        return queues_store.set_job_rate_plan(self.schema, kind, name, max_starts, period)

    def _rates_plan(self) -> Plan[list[RateLimit]]:
        queues = yield from queues_store.rates_plan(self.schema)
        jobs = yield from queues_store.job_rates_plan(self.schema)
        return queues + jobs

    def _workflow_plan(
        self, flow: Flow, after: Iterable[int], on_failure: OnFailure
    ) -> Plan[EnqueuedWorkflow]:
        nodes = build(flow, [_job_id(i) for i in after], on_failure)
        return workflows_store.enqueue_plan(nodes, self.schema, self.settings.max_payload_bytes)

    def _get_workflow_plan(self, workflow_id: int) -> Plan[Workflow | None]:
        return workflows_store.get_plan(_job_id(workflow_id), self.schema)


def _atomic_timeout(timeout: timedelta | None) -> timedelta:
    """An atomic job holds a transaction for its whole run, which holds back VACUUM: its
    time is always bounded."""
    if timeout is None:
        return ATOMIC_DEFAULT_TIMEOUT
    if timeout > ATOMIC_MAX_TIMEOUT:
        raise ConfigurationError(
            f"atomic tasks hold a transaction open for their whole run; timeout={timeout} is "
            f"over the {ATOMIC_MAX_TIMEOUT} limit: use a lease (non-atomic) task instead"
        )
    return timeout


def _job_id(value: object) -> int:
    """A job id as the API takes it: a whole number that a bigint column can hold."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise ConfigurationError(
            f"job ids are whole numbers from 1 to 2**63-1 (as enqueue returns them), got {value!r}"
        )
    return value


def _message_id(value: object) -> int:
    """An outbox id as stage returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise ConfigurationError(
            f"message ids are whole numbers from 1 to 2**63-1 (as stage returns them), got "
            f"{value!r}"
        )
    return value


def _message(
    destination: str,
    message: Any,
    key: str | None,
    headers: dict[str, str] | None,
    message_id: str | None,
) -> Message:
    """stage()'s arguments as a Message, or an InvalidArgumentsError that says what is wrong."""
    try:
        return Message(
            destination=destination,
            message=message,
            key=key,
            headers=headers,
            message_id=message_id,
        )
    except ValidationError as exc:
        raise InvalidArgumentsError(f"a message for {destination!r}: {exc}") from None


def _task_name(task: str | Task[..., Any]) -> str:
    """A task's name, from the task or as a string checked as task names are."""
    if isinstance(task, Task):
        return task.name
    if not isinstance(task, str):
        raise ConfigurationError(f"name a task, or pass the task itself; got {task!r}")
    return check_name("task", task, TASK_NAME)


def _queue_names(queues: str | Sequence[str]) -> list[str]:
    """One queue name or several, each checked as an enqueue checks it."""
    names = [queues] if isinstance(queues, str) else list(queues)
    if not names:
        raise ConfigurationError("name at least one queue")
    return list(dict.fromkeys(check_name("queue", name, QUEUE_NAME) for name in names))


_RATE_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_RATE_STARTS = 10_000


def _rate(limit: int | str, per: timedelta | float | None) -> tuple[int, float]:
    """(max_starts, seconds) from `100, per=60` or "100/m" ("N/s", "N/m", "N/h")."""
    if isinstance(limit, str):
        count, _, unit = limit.strip().partition("/")
        if per is not None or unit not in _RATE_UNITS or not count.strip().isdigit():
            raise ConfigurationError(
                f"a rate limit is 'N/s', 'N/m' or 'N/h', or N with per= seconds; got {limit!r}"
            )
        limit, seconds = int(count), float(_RATE_UNITS[unit])
    else:
        window = duration(per, "per")
        if window is None:
            raise ConfigurationError("give the window: set_rate_limit(queue, 100, per=60)")
        seconds = window.total_seconds()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RATE_STARTS:
        raise ConfigurationError(
            f"a rate limit lets 1 to {MAX_RATE_STARTS:,} jobs start, got {limit!r}"
        )
    if not 0 < seconds <= 86400:
        raise ConfigurationError(
            f"a rate limit's window is over 0 s and at most a day, got {seconds} s"
        )
    return limit, seconds


def _jobs_only(jobs: Iterable[NewJob]) -> list[NewJob]:
    batch = list(jobs)
    for item in batch:
        if not isinstance(item, NewJob):
            raise TypeError(
                f"enqueue_many takes jobs built with task.job(...), got {type(item).__name__}"
            )
    return batch


def _alone(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a statement on `conn` is a transaction of its own (autocommit, no block open)."""
    return conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def _require(conn: object, kind: type, method: str) -> None:
    if not isinstance(conn, kind):
        raise _wrong_connection(conn, kind, method)


def _adapter(conn: object, kind: type, method: str) -> hooks.ConnectionAdapter:
    """The adapter that gives the psycopg connection under `conn`, another library's
    connection object (a SQLAlchemy Session, through pgqueue/contrib/sqlalchemy.py)."""
    adapter = hooks.adapter_for(conn)
    if adapter is None:
        raise _wrong_connection(conn, kind, method)
    return adapter


def _wrong_connection(conn: object, kind: type, method: str) -> TypeError:
    return TypeError(
        f"{method} needs a {kind.__module__}.{kind.__name__}, got {type(conn).__name__}"
    )


class Queue(_Base):
    """The sync client. `conn` arguments are psycopg `Connection`s, or SQLAlchemy `Session`s
    or `Connection`s on the psycopg driver."""

    _pool: ConnectionPool | None = None  # opened on first use
    _borrow: Callable[[], psycopg.Connection[Any]] | None = None  # see use_connection

    def use_connection(self, provider: Callable[[], psycopg.Connection[Any]] | None) -> None:
        """Run calls given no `conn=` on the connection `provider` returns, inside whatever
        transaction it has open, never committing it: how a framework's own connection
        becomes the default (pgqueue.contrib.django does this). None goes back to the
        queue's own pool."""
        self._borrow = provider

    def _enqueue_task(self, task: Task[..., Any]) -> Callable[[NewJob], Enqueued[Any]]:
        return self.enqueue

    def enqueue(
        self,
        job: NewJob[T] | str | Task[..., Any],
        args: dict[str, Any] | None = None,
        *,
        conn: Conn | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued[T]:
        """Store one job and return its id. `job` is task.job(...), a task, or a task name.

        The id is an `Enqueued`, an int whose `created` is False when `dedupe_key` found an
        existing job (queued, scheduled, running, or finished within `dedupe_window`).
        """
        return self.enqueue_many([self._new_job(job, args, options)], conn=conn)[0]

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: Conn | None = None) -> list[Enqueued]:
        """Store many jobs in one statement; 64 or more plain jobs (no dedupe key, run_at or
        delay) by COPY (pgqueue/bulk.py); jobs with dedupe keys take two statements. Ids come
        back in the order given."""
        batch = _jobs_only(jobs)
        if not batch:
            return []
        hooked = hooks.enqueuing(batch)
        if hooked is None:
            return self._store(batch, conn)
        with hooked as seen:
            seen.extend(ids := self._store(batch, conn))
            return ids

    def _store(self, batch: Sequence[NewJob], conn: Conn | None) -> list[Enqueued]:
        with self._connection(conn) as c:
            if jobs_store.keyed(batch):
                return run(c, self._enqueue_plan(batch))
            if bulk.copyable(batch, c):
                return jobs_store.copy_in(c, batch, self.schema, self.settings.max_payload_bytes)
            own = conn is None and self._borrow is None
            statement, params = self._insert(batch, alone=own or _alone(c))
            with psycopg.Cursor(c) as cur:  # see pgqueue.store.plan.run
                return jobs_store.enqueued(cur.execute(statement, params).fetchall())

    def list_jobs(self, *, conn: Conn | None = None, **filters: Unpack[_JobFilters]) -> JobPage:
        """A page of job records, newest first, live and finished. Filters: queue, task,
        concurrency_key (the tenant), status (one or several), created_after, created_before;
        before_id and limit (1-1000, default 50) page through: pass the page's
        `next_before_id` as `before_id`. after_id bounds how far back it looks: only ids
        above it, so a filter that matches rarely reads no more than that range."""
        with self._connection(conn) as c:
            return run(c, self._list_plan(filters), together=False)

    def cancel_job(self, job_id: int, *, conn: Conn | None = None) -> Cancellation:
        """Cancel a job: at once if queued or scheduled; if running, its worker is told and
        it ends as cancelled. Raises JobNotFoundError, or
        JobStateError for a running atomic job."""
        with self._connection(conn) as c:
            return run(c, self._cancel_plan(job_id), together=False)

    def retry_job(self, job_id: int, *, conn: Conn | None = None) -> Enqueued:
        """Enqueue a failed or cancelled job again, with a fresh attempt count; the new
        job's `retry_of` is `job_id`. Raises JobStateError otherwise, or if a retry of it is
        still queued or running."""
        with self._connection(conn) as c:
            return run(c, self._retry_plan(job_id))

    def migrate(self, *, conn: psycopg.Connection[Any] | None = None) -> list[str]:
        """Apply pending migrations to this queue's schema; returns their names.

        With `conn`, it must not be inside a transaction: migrations commit.
        """
        if conn is not None:
            _require(conn, psycopg.Connection, "Queue")
            with _Borrowed(conn, self.schema) as c:
                return _names(migrate.apply(c, self.schema))
        if self.dsn is None:
            raise ConfigurationError(dsn_rule.missing("Queue"))
        with _connect(self.dsn, autocommit=True) as own:
            return self.migrate(conn=own)

    def get_job(self, job_id: int, *, conn: Conn | None = None) -> Job | None:
        """The job's record from the hot table or history, or None if there is none."""
        with self._connection(conn) as c:
            return run(c, self._get_plan(job_id), together=False)

    def job_steps(self, job_id: int, *, conn: Conn | None = None) -> JobSteps:
        """The durable calls the job recorded (JobContext.step, sleep, wait_for_signal), in
        order, and what it waits for now: a sleep's end, or the signal it is parked for. A
        job that made none, or that does not exist, has no steps."""
        with self._connection(conn) as c:
            return run(c, self._steps_plan(job_id), together=False)

    def sync_tasks(self, *, conn: Conn | None = None) -> list[str]:
        """Write the declarations of this queue's tasks that have a handler here (queue,
        priority, max_attempts, delay, keys, policy) to the database, where `enqueue()` in SQL
        reads the options a job gets when its call does not give them. Returns the names whose
        declaration was new or changed. A worker does this as it starts, and so does
        `pgqueue migrate --app`; call it when a changed declaration must reach SQL first."""
        with self._connection(conn) as c:
            return run(c, self._sync_plan())

    def _connection(self, conn: Conn | None) -> Any:
        if conn is not None:
            if isinstance(conn, psycopg.Connection):
                return _Borrowed(conn, self.schema)
            adapter = _adapter(conn, psycopg.Connection, "Queue")
            return _Borrowed(adapter.connection(conn), self.schema)
        if self._borrow is not None:
            return _Borrowed(self._borrow(), self.schema)
        return _Pooled(self.pool(), self.schema)

    def pool(self) -> ConnectionPool:
        """The queue's own pool, opened on first use. Needs `dsn`."""
        if self._pool is None:
            if self.dsn is None:
                raise ConfigurationError(dsn_rule.missing("Queue"))
            _connect(self.dsn).close()
            self._pool = ConnectionPool(
                self.dsn, min_size=1, max_size=4, open=False, kwargs=self._pool_options()
            )
            self._pool.open(wait=True, timeout=10)
        return self._pool

    def close(self) -> None:
        """Close the queue's own pool, if it opened one; a later call without `conn=` opens
        it again. Connections you passed in are yours and stay open. Waits in progress fail;
        the waits' connection is closed (a later wait opens it again)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        waiters, self._waiters = self._waiters, None
        if waiters is not None:
            waiters.close()

    def set_concurrency_limit(
        self,
        key: str | None,
        max_running: int | None,
        *,
        conn: Conn | None = None,
    ) -> None:
        """Let at most `max_running` jobs with concurrency key `key` run at once (key None:
        the default for keys without a limit of their own; max_running None: remove the
        limit). Takes effect for the next claims; waiting jobs a raise makes room for are
        woken at commit."""
        plan = self._set_limit_plan(key, max_running)
        with self._connection(conn) as c:
            run(c, plan)

    def set_fairness_weight(
        self, key: str, weight: float | None, *, conn: Conn | None = None
    ) -> None:
        """Give fairness key `key` a weight (None: back to the default, 1): among a queue's
        backlogged keys, each gets started jobs in proportion to its weight. Applies to jobs
        enqueued from then on."""
        plan = self._weight_plan(key, weight)
        with self._connection(conn) as c:
            run(c, plan)

    def fair_shares(
        self, *, window: timedelta | float = 300, conn: Conn | None = None
    ) -> list[FairShare]:
        """Per queue and fairness key: weight, queued and running jobs, and the share of the
        queue's fair starts over the last `window` (seconds or a timedelta, rounded down to
        whole minutes) against the share its weight owes it."""
        plan = self._shares_plan(window)
        with self._connection(conn) as c:
            return run(c, plan, together=False)

    def concurrency_limits(self, *, conn: Conn | None = None) -> list[ConcurrencyLimit]:
        """Every key with a limit, running jobs or waiting jobs; the default ('*') first."""
        with self._connection(conn) as c:
            return run(c, self._limits_plan(), together=False)

    def pause_queue(
        self,
        queues: str | Sequence[str],
        *,
        reason: str = "",
        conn: Conn | None = None,
    ) -> list[str]:
        """Pause one queue or several: no worker claims their jobs from its next claim on,
        and jobs already running finish. Enqueues still go in. Holds until resumed, across
        worker restarts. Returns the queues that were not paused already."""
        plan = self._pause_plan(queues, reason)
        with self._connection(conn) as c:
            return run(c, plan, together=False)

    def stage(
        self,
        destination: str,
        message: Any,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
        conn: Conn | None = None,
    ) -> int:
        """Stage a message for another system, for `pgqueue relay` to publish once this
        transaction commits (it never commits for you; a rollback drops the message).
        Returns its outbox id. See `Message` for the parameters."""
        staged = _message(destination, message, key, headers, message_id)
        return self.stage_many([staged], conn=conn)[0]

    def stage_many(self, messages: Iterable[Message], *, conn: Conn | None = None) -> list[int]:
        """Stage several messages in one statement; their ids in the order given."""
        plan = self._stage_plan(messages)
        with self._connection(conn) as c:
            return run(c, plan)

    def outbox_stats(self, *, conn: Conn | None = None) -> OutboxStats:
        """Staged messages, the oldest one's time, and dead letters."""
        with self._connection(conn) as c:
            return run(c, outbox_store.stats_plan(self.schema), together=False)

    def dead_messages(self, *, limit: int = 50, conn: Conn | None = None) -> list[DeadMessage]:
        """Messages a broker refused for good, newest first, with the reason."""
        with self._connection(conn) as c:
            return run(c, self._dead_plan(limit), together=False)

    def retry_messages(self, ids: Sequence[int] | None = None, *, conn: Conn | None = None) -> int:
        """Stage dead messages again, all or those named; how many. The relay publishes
        them next, after what it has in hand."""
        plan = self._retry_messages_plan(ids)
        with self._connection(conn) as c:
            return run(c, plan)

    def resume_queue(self, queues: str | Sequence[str], *, conn: Conn | None = None) -> list[str]:
        """Resume paused queues; their workers are woken and claim from each one's first
        job. Returns the queues that were paused."""
        plan = self._resume_plan(queues)
        with self._connection(conn) as c:
            return run(c, plan, together=False)

    def paused_queues(self, *, conn: Conn | None = None) -> list[QueuePause]:
        """The paused queues, by name, with when and why each was paused."""
        with self._connection(conn) as c:
            return run(c, self._paused_plan(), together=False)

    def set_rate_limit(
        self,
        queue: str,
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: Conn | None = None,
    ) -> None:
        """Let at most `limit` jobs of `queue` start in any window of `per` seconds, across
        every worker: `set_rate_limit("sms", 10, per=1)`, or `set_rate_limit("sms", "600/m")`.
        None removes the limit. Workers hear of it at commit."""
        plan = self._set_rate_plan(queue, limit, per)
        with self._connection(conn) as c:
            run(c, plan)

    def set_task_rate_limit(
        self,
        task: str | Task[..., Any],
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: Conn | None = None,
    ) -> None:
        """Let at most `limit` jobs of `task` start in any window of `per` seconds, in
        whatever queue, across every worker: `set_task_rate_limit(send_sms, "10/s")`. Jobs
        over it are put back as scheduled, without spending an attempt, for when the window
        has room; the queue's other jobs run meanwhile. None removes the limit."""
        plan = self._set_job_rate_plan("task", _task_name(task), limit, per)
        with self._connection(conn) as c:
            run(c, plan)

    def set_key_rate_limit(
        self,
        key: str | None,
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: Conn | None = None,
    ) -> None:
        """Let at most `limit` jobs with concurrency key `key` start in any window of `per`
        seconds, as set_task_rate_limit does for a task. Key None sets the default: every
        key without a limit of its own gets one of that rate, with its own window."""
        plan = self._set_job_rate_plan("key", limit_key(key), limit, per)
        with self._connection(conn) as c:
            run(c, plan)

    def rate_limits(self, *, conn: Conn | None = None) -> list[RateLimit]:
        """Every rate limit (queues', then tasks', then keys'), with the starts in its
        current window."""
        with self._connection(conn) as c:
            return run(c, self._rates_plan(), together=False)

    def enqueue_workflow(
        self,
        flow: Flow,
        *,
        after: Iterable[int] = (),
        on_failure: OnFailure = "cancel",
        conn: Conn | None = None,
    ) -> EnqueuedWorkflow:
        """Store a workflow, `chain`, `group`, `chord` or one job, whole, in one transaction
        (yours, with `conn`). Its first steps wait for the jobs `after` names, if any: each
        live one is locked until your transaction commits. A job that waits runs once all it
        waits for have succeeded; one that fails or is cancelled cancels it, unless
        `on_failure="run"` (for those first steps; a chord takes its own)."""
        with self._connection(conn) as c:
            return run(c, self._workflow_plan(flow, after, on_failure))

    def get_workflow(self, workflow_id: int, *, conn: Conn | None = None) -> Workflow | None:
        """A workflow's jobs and their states, or None if no job belongs to it."""
        with self._connection(conn) as c:
            return run(c, self._get_workflow_plan(workflow_id), together=False)

    # Waiting for results (pgqueue/waiting.py, pgqueue/outcomes.py): every wait of this
    # queue shares one listening connection, on a thread of its own.

    wait_settings: WaitSettings = WaitSettings()
    """How waits hear that a job finished (LISTEN, and polling); set before the first wait."""
    _waiters: BackgroundWaiters | None = None

    @overload
    def wait(self, job: Enqueued[T], *, timeout: timedelta | float | None = None) -> T: ...
    @overload
    def wait(self, job: JobHandle, *, timeout: timedelta | float | None = None) -> Any: ...

    def wait(self, job: JobHandle, *, timeout: timedelta | float | None = None) -> Any:
        """Wait until `job` (an id, as enqueue returns it, or a Job) finishes; its result, as
        stored (the handler's return value as JSON). Raises JobFailedError (with the recorded
        error type, message and traceback) if it failed, JobCancelledError if it was
        cancelled, WaitTimeoutError after `timeout` seconds (the job runs on), and
        JobNotFoundError if no record of it exists, live or in history. Wait after the
        enqueue's transaction has committed. For a type checker, the result of a job whose
        id enqueue returned (an `Enqueued[T]`) is a T, what its handler returns."""
        return self._hub().call(outcomes.wait, job, outcomes.seconds(timeout))

    def wait_many(
        self,
        jobs: Iterable[JobHandle],
        *,
        timeout: timedelta | float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Wait for several jobs; their results in the order given, like asyncio.gather: the
        first job to fail or be cancelled raises its error at once (the others run on), or
        with `return_exceptions` its error takes its place in the list. `timeout` bounds the
        whole wait."""
        limit = outcomes.seconds(timeout)
        return self._hub().call(outcomes.wait_many, jobs, limit, return_exceptions)

    def as_completed(
        self, jobs: Iterable[JobHandle], *, timeout: timedelta | float | None = None
    ) -> Iterator[JobOutcome]:
        """Each job's `JobOutcome` (its id, status, and result or error) as it finishes,
        whatever the order given; raises WaitTimeoutError, naming the jobs left, once
        `timeout` has passed."""
        ids, limit = outcomes.job_ids(jobs), outcomes.seconds(timeout)
        waiters = self._hub()
        return waiters.iterate(outcomes.as_completed(waiters.hub, ids, limit))

    def wait_workflow(
        self, workflow: WorkflowHandle, *, timeout: timedelta | float | None = None
    ) -> Workflow:
        """Wait until every job of `workflow` (its id, what enqueue_workflow returned, or a
        Workflow) has finished, however it finished; the workflow as it ended, so
        `.succeeded` says whether all went well and each job's status what happened to it.
        Raises WaitTimeoutError after `timeout` seconds, naming the jobs still going (they
        run on), and JobNotFoundError if no job belongs to a workflow of that id. A result is
        one job's: `wait(enqueued.job_ids[-1])` gives a chain's last."""
        limit = outcomes.seconds(timeout)
        ids = outcomes.workflow_job_ids(workflow)
        workflow_id = workflow if isinstance(workflow, int) else workflow.id
        if ids is None:
            ids = _workflow_jobs(self.get_workflow(workflow_id), workflow_id)
        self._hub().call(outcomes.wait_all, ids, limit)
        return _workflow_jobs_ended(self.get_workflow(workflow_id), workflow_id)

    def _hub(self) -> BackgroundWaiters:
        with STARTING:
            if self._waiters is None:
                hub = new_hub(self.dsn, self.settings, self.wait_settings, "Queue")
                self._waiters = BackgroundWaiters(hub)
            return self._waiters

    def signal(self, key: str, payload: Any = None, *, conn: Conn | None = None) -> int:
        """Send a signal for `key` with a JSON `payload` to the job that waits for it
        (JobContext.wait_for_signal), or will: a signal nobody waits for yet is kept for the
        next job that does. With `conn` it joins your transaction: delivered only if that
        commits, and then exactly once; the same statement wakes the job parked for the key.
        Returns the signal's id."""
        plan = signal_plan(self.schema, key, payload, self.settings.max_payload_bytes)
        with self._connection(conn) as c:
            return run(c, plan)


class AsyncQueue(_Base):
    """The async twin. `conn` arguments are psycopg `AsyncConnection`s, or SQLAlchemy
    `AsyncSession`s or `AsyncConnection`s on the psycopg driver."""

    _pool: AsyncConnectionPool | None = None  # opened on first use
    _borrow: Callable[[], psycopg.AsyncConnection[Any]] | None = None  # see use_connection

    def use_connection(self, provider: Callable[[], psycopg.AsyncConnection[Any]] | None) -> None:
        self._borrow = provider

    _task_class = AsyncTask

    if TYPE_CHECKING:
        # The inherited task, declare and periodic, as a type checker should see them here:
        # making AsyncTasks, whose `enqueue` is awaited. mypy cannot match these overloads to
        # _Base's one by one (override), though each returns a subclass of what it returns.
        @overload  # type: ignore[override]
        def task(self, fn: _ContextFirst[P, R], /) -> AsyncTask[P, R]: ...
        @overload
        def task(self, fn: _WithContext[R], /) -> AsyncTask[..., R]: ...
        @overload
        def task(self, fn: Callable[P, R], /) -> AsyncTask[P, R]: ...
        @overload
        def task(self, /, **options: Unpack[_TaskOptions]) -> _AsyncRegistering: ...
        def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any: ...

        def declare(
            self, name: str, *, atomic: bool = False, **options: Unpack[EnqueueOptions]
        ) -> AsyncTask[..., Any]: ...

        @overload  # type: ignore[override]
        def periodic(  # type: ignore[overload-overlap]
            self, task: TaskT, /, **options: Unpack[_PeriodicOptions]
        ) -> TaskT: ...
        @overload
        def periodic(
            self, task: _ContextFirst[P, R], /, **options: Unpack[_PeriodicOptions]
        ) -> AsyncTask[P, R]: ...
        @overload
        def periodic(
            self, task: _WithContext[R], /, **options: Unpack[_PeriodicOptions]
        ) -> AsyncTask[..., R]: ...
        @overload
        def periodic(
            self, task: Callable[P, R], /, **options: Unpack[_PeriodicOptions]
        ) -> AsyncTask[P, R]: ...
        @overload
        def periodic(
            self, task: str, /, **options: Unpack[_PeriodicOptions]
        ) -> AsyncTask[..., Any]: ...
        @overload
        def periodic(
            self, task: None = None, /, **options: Unpack[_PeriodicOptions]
        ) -> _AsyncScheduling: ...
        def periodic(self, task: Any = None, /, **options: Any) -> Any: ...

    def _enqueue_task(self, task: Task[..., Any]) -> Callable[[NewJob], Any]:
        return self.enqueue

    async def enqueue(
        self,
        job: NewJob[T] | str | Task[..., Any],
        args: dict[str, Any] | None = None,
        *,
        conn: AsyncConn | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued[T]:
        return (await self.enqueue_many([self._new_job(job, args, options)], conn=conn))[0]

    async def enqueue_many(
        self, jobs: Iterable[NewJob], *, conn: AsyncConn | None = None
    ) -> list[Enqueued]:
        batch = _jobs_only(jobs)
        if not batch:
            return []
        hooked = hooks.enqueuing(batch)
        if hooked is None:
            return await self._store(batch, conn)
        with hooked as seen:
            seen.extend(ids := await self._store(batch, conn))
            return ids

    async def _store(self, batch: Sequence[NewJob], conn: AsyncConn | None) -> list[Enqueued]:
        async with self._connection(conn) as c:
            if jobs_store.keyed(batch):
                return await run_async(c, self._enqueue_plan(batch))
            if bulk.copyable(batch, c):
                limit = self.settings.max_payload_bytes
                return await jobs_store.copy_in_async(c, batch, self.schema, limit)
            own = conn is None and self._borrow is None
            statement, params = self._insert(batch, alone=own or _alone(c))
            async with psycopg.AsyncCursor(c) as cur:  # see pgqueue.store.plan.run
                return jobs_store.enqueued(await (await cur.execute(statement, params)).fetchall())

    async def list_jobs(
        self, *, conn: AsyncConn | None = None, **filters: Unpack[_JobFilters]
    ) -> JobPage:
        async with self._connection(conn) as c:
            return await run_async(c, self._list_plan(filters), together=False)

    async def cancel_job(self, job_id: int, *, conn: AsyncConn | None = None) -> Cancellation:
        async with self._connection(conn) as c:
            return await run_async(c, self._cancel_plan(job_id), together=False)

    async def retry_job(self, job_id: int, *, conn: AsyncConn | None = None) -> Enqueued:
        async with self._connection(conn) as c:
            return await run_async(c, self._retry_plan(job_id))

    async def migrate(self, *, conn: psycopg.AsyncConnection[Any] | None = None) -> list[str]:
        if conn is not None:
            _require(conn, psycopg.AsyncConnection, "AsyncQueue")
            async with _AsyncBorrowed(conn, self.schema) as c:
                return _names(await migrate.apply_async(c, self.schema))
        if self.dsn is None:
            raise ConfigurationError(dsn_rule.missing("AsyncQueue"))
        async with await _connect_async(self.dsn, autocommit=True) as own:
            return await self.migrate(conn=own)

    async def get_job(self, job_id: int, *, conn: AsyncConn | None = None) -> Job | None:
        async with self._connection(conn) as c:
            return await run_async(c, self._get_plan(job_id), together=False)

    async def job_steps(self, job_id: int, *, conn: AsyncConn | None = None) -> JobSteps:
        async with self._connection(conn) as c:
            return await run_async(c, self._steps_plan(job_id), together=False)

    async def sync_tasks(self, *, conn: AsyncConn | None = None) -> list[str]:
        async with self._connection(conn) as c:
            return await run_async(c, self._sync_plan())

    def _connection(self, conn: AsyncConn | None) -> Any:
        if conn is not None:
            if isinstance(conn, psycopg.AsyncConnection):
                return _AsyncBorrowed(conn, self.schema)
            adapter = _adapter(conn, psycopg.AsyncConnection, "AsyncQueue")
            return _AsyncBorrowed(conn, self.schema, adapter)
        if self._borrow is not None:
            return _AsyncBorrowed(self._borrow(), self.schema)
        return _AsyncPooled(self)

    async def pool(self) -> AsyncConnectionPool:
        if self._pool is None:
            if self.dsn is None:
                raise ConfigurationError(dsn_rule.missing("AsyncQueue"))
            await (await _connect_async(self.dsn)).close()
            pool = AsyncConnectionPool(
                self.dsn, min_size=1, max_size=4, open=False, kwargs=self._pool_options()
            )
            await pool.open(wait=True, timeout=10)
            self._pool = pool
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        waiters, self._waiters = self._waiters, None
        if waiters is not None and waiters.loop is _running_loop():
            await waiters.close()

    async def set_concurrency_limit(
        self,
        key: str | None,
        max_running: int | None,
        *,
        conn: AsyncConn | None = None,
    ) -> None:
        plan = self._set_limit_plan(key, max_running)
        async with self._connection(conn) as c:
            await run_async(c, plan)

    async def set_fairness_weight(
        self, key: str, weight: float | None, *, conn: AsyncConn | None = None
    ) -> None:
        plan = self._weight_plan(key, weight)
        async with self._connection(conn) as c:
            await run_async(c, plan)

    async def fair_shares(
        self, *, window: timedelta | float = 300, conn: AsyncConn | None = None
    ) -> list[FairShare]:
        plan = self._shares_plan(window)
        async with self._connection(conn) as c:
            return await run_async(c, plan, together=False)

    async def concurrency_limits(self, *, conn: AsyncConn | None = None) -> list[ConcurrencyLimit]:
        async with self._connection(conn) as c:
            return await run_async(c, self._limits_plan(), together=False)

    async def pause_queue(
        self,
        queues: str | Sequence[str],
        *,
        reason: str = "",
        conn: AsyncConn | None = None,
    ) -> list[str]:
        plan = self._pause_plan(queues, reason)
        async with self._connection(conn) as c:
            return await run_async(c, plan, together=False)

    async def stage(
        self,
        destination: str,
        message: Any,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
        conn: AsyncConn | None = None,
    ) -> int:
        staged = _message(destination, message, key, headers, message_id)
        return (await self.stage_many([staged], conn=conn))[0]

    async def stage_many(
        self, messages: Iterable[Message], *, conn: AsyncConn | None = None
    ) -> list[int]:
        plan = self._stage_plan(messages)
        async with self._connection(conn) as c:
            return await run_async(c, plan)

    async def outbox_stats(self, *, conn: AsyncConn | None = None) -> OutboxStats:
        async with self._connection(conn) as c:
            return await run_async(c, outbox_store.stats_plan(self.schema), together=False)

    async def dead_messages(
        self, *, limit: int = 50, conn: AsyncConn | None = None
    ) -> list[DeadMessage]:
        async with self._connection(conn) as c:
            return await run_async(c, self._dead_plan(limit), together=False)

    async def retry_messages(
        self, ids: Sequence[int] | None = None, *, conn: AsyncConn | None = None
    ) -> int:
        plan = self._retry_messages_plan(ids)
        async with self._connection(conn) as c:
            return await run_async(c, plan)

    async def resume_queue(
        self, queues: str | Sequence[str], *, conn: AsyncConn | None = None
    ) -> list[str]:
        plan = self._resume_plan(queues)
        async with self._connection(conn) as c:
            return await run_async(c, plan, together=False)

    async def paused_queues(self, *, conn: AsyncConn | None = None) -> list[QueuePause]:
        async with self._connection(conn) as c:
            return await run_async(c, self._paused_plan(), together=False)

    async def set_rate_limit(
        self,
        queue: str,
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: AsyncConn | None = None,
    ) -> None:
        plan = self._set_rate_plan(queue, limit, per)
        async with self._connection(conn) as c:
            await run_async(c, plan)

    async def set_task_rate_limit(
        self,
        task: str | Task[..., Any],
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: AsyncConn | None = None,
    ) -> None:
        plan = self._set_job_rate_plan("task", _task_name(task), limit, per)
        async with self._connection(conn) as c:
            await run_async(c, plan)

    async def set_key_rate_limit(
        self,
        key: str | None,
        limit: int | str | None,
        *,
        per: timedelta | float | None = None,
        conn: AsyncConn | None = None,
    ) -> None:
        plan = self._set_job_rate_plan("key", limit_key(key), limit, per)
        async with self._connection(conn) as c:
            await run_async(c, plan)

    async def rate_limits(self, *, conn: AsyncConn | None = None) -> list[RateLimit]:
        async with self._connection(conn) as c:
            return await run_async(c, self._rates_plan(), together=False)

    async def enqueue_workflow(
        self,
        flow: Flow,
        *,
        after: Iterable[int] = (),
        on_failure: OnFailure = "cancel",
        conn: AsyncConn | None = None,
    ) -> EnqueuedWorkflow:
        async with self._connection(conn) as c:
            return await run_async(c, self._workflow_plan(flow, after, on_failure))

    async def get_workflow(
        self, workflow_id: int, *, conn: AsyncConn | None = None
    ) -> Workflow | None:
        async with self._connection(conn) as c:
            return await run_async(c, self._get_workflow_plan(workflow_id), together=False)

    wait_settings: WaitSettings = WaitSettings()
    _waiters: Waiters | None = None  # its loop's; a wait on another loop starts another

    @overload
    async def wait(self, job: Enqueued[T], *, timeout: timedelta | float | None = None) -> T: ...
    @overload
    async def wait(self, job: JobHandle, *, timeout: timedelta | float | None = None) -> Any: ...

    async def wait(self, job: JobHandle, *, timeout: timedelta | float | None = None) -> Any:
        return await outcomes.wait(self._hub(), job, outcomes.seconds(timeout))

    async def wait_many(
        self,
        jobs: Iterable[JobHandle],
        *,
        timeout: timedelta | float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        limit = outcomes.seconds(timeout)
        return await outcomes.wait_many(self._hub(), jobs, limit, return_exceptions)

    def as_completed(
        self, jobs: Iterable[JobHandle], *, timeout: timedelta | float | None = None
    ) -> AsyncIterator[JobOutcome]:
        ids, limit = outcomes.job_ids(jobs), outcomes.seconds(timeout)
        return outcomes.as_completed(self._hub(), ids, limit)

    async def wait_workflow(
        self, workflow: WorkflowHandle, *, timeout: timedelta | float | None = None
    ) -> Workflow:
        limit = outcomes.seconds(timeout)
        ids = outcomes.workflow_job_ids(workflow)
        workflow_id = workflow if isinstance(workflow, int) else workflow.id
        if ids is None:
            ids = _workflow_jobs(await self.get_workflow(workflow_id), workflow_id)
        await outcomes.wait_all(self._hub(), ids, limit)
        return _workflow_jobs_ended(await self.get_workflow(workflow_id), workflow_id)

    def _hub(self) -> Waiters:
        loop = _running_loop()
        if self._waiters is None or self._waiters.loop not in (None, loop):
            self._waiters = new_hub(self.dsn, self.settings, self.wait_settings, "AsyncQueue")
        return self._waiters

    async def signal(self, key: str, payload: Any = None, *, conn: AsyncConn | None = None) -> int:
        plan = signal_plan(self.schema, key, payload, self.settings.max_payload_bytes)
        async with self._connection(conn) as c:
            return await run_async(c, plan)


def _workflow_jobs(found: Workflow | None, workflow_id: int) -> list[int]:
    if found is None:
        raise JobNotFoundError(f"no job belongs to a workflow with id {workflow_id}")
    return [job.id for job in found.jobs]


def _workflow_jobs_ended(found: Workflow | None, workflow_id: int) -> Workflow:
    if found is None:  # its history was pruned between the wait and the read
        raise JobNotFoundError(
            f"the jobs of workflow {workflow_id} finished, but their records are gone "
            "(keep_history=False, or pruned by retention)"
        )
    return found


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _connect(dsn: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection of the queue's own; fails fast and clearly on a malformed DSN or an
    unreachable server, before a pool would retry in the background until its timeout."""
    _check_dsn(dsn)
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unreachable(dsn, exc) from None


async def _connect_async(dsn: str, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
    """`_connect` for the async twin, without blocking the event loop."""
    _check_dsn(dsn)
    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unreachable(dsn, exc) from None


def _check_dsn(dsn: str) -> None:
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"invalid DSN: {exc}") from None


def _unreachable(dsn: str, exc: psycopg.Error) -> DatabaseError:
    return DatabaseError(f"cannot connect to {redact(dsn)}: {exc}".strip())


def _names(applied: list[Migration]) -> list[str]:
    return [f"{m.version:04d}_{m.name}" for m in applied]


def _usable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Refuse a connection no statement can run on, before trying one."""
    if conn.closed:
        raise DatabaseError("the connection passed as conn= is closed: pass an open one")
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        raise DatabaseError(
            "the transaction of the connection passed as conn= was aborted by an earlier "
            "error: roll it back (conn.rollback()) before using it again"
        )


def _translate(exc: BaseException | None, schema: str) -> None:
    """Raise the pgqueue error that a database error from one call stands for. Serialization
    failures and deadlocks pass unchanged: callers retry those by their psycopg class."""
    if not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.errors.TransactionRollback):
        return
    missing = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    if isinstance(exc, missing):
        option = "" if schema == "pgqueue" else f" --schema {schema}"
        raise DatabaseError(
            f"schema {schema!r} lacks pgqueue's tables or functions: run `pgqueue "
            f"migrate{option}` (or queue.migrate()) first ({exc})"
        ) from exc
    if _connection_lost(exc):
        raise ConnectionLostError(f"the connection was closed or lost: {exc}".strip()) from exc
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        raise DatabaseError(
            f"{exc.diag.message_primary or exc}: this role lacks a grant this call needs; "
            "`pgqueue grant ROLE --kind worker|app|read|operator` grants what each needs"
        ) from exc
    if isinstance(exc, psycopg.errors.InFailedSqlTransaction):
        raise DatabaseError(
            "the transaction was aborted by an earlier error: roll it back first"
        ) from exc
    raise DatabaseError(f"{type(exc).__name__}: {exc}".strip()) from exc


def _connection_lost(exc: psycopg.Error) -> bool:
    """A closed or broken connection: psycopg's own (no SQLSTATE), a connection exception
    (class 08) or the server shutting the session down (57P01-57P03)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


class _Borrowed:
    """The caller's connection as a context manager that leaves its transaction alone."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema

    def __enter__(self) -> psycopg.Connection[Any]:
        _usable(self.conn)
        return self.conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        _translate(exc, self.schema)


class _Pooled:
    """A connection of the queue's pool, committed on success, as psycopg_pool does."""

    def __init__(self, pool: ConnectionPool, schema: str) -> None:
        self._cm = pool.connection()
        self.schema = schema

    def __enter__(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] = self._cm.__enter__()
        return conn

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._cm.__exit__(kind, exc, tb)
        except BaseException as commit_failed:
            _translate(commit_failed, self.schema)
            raise
        _translate(exc, self.schema)


class _AsyncBorrowed:
    """The caller's connection, or another library's connection object and the adapter that
    gives the psycopg connection under it, as a context manager that leaves its transaction
    alone."""

    def __init__(
        self, conn: AsyncConn, schema: str, adapter: hooks.ConnectionAdapter | None = None
    ) -> None:
        self.given = conn
        self.schema = schema
        self.adapter = adapter

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        if self.adapter is not None:
            conn = await self.adapter.async_connection(self.given)
        else:
            assert isinstance(self.given, psycopg.AsyncConnection)
            conn = self.given
        _usable(conn)
        return conn

    async def __aexit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        _translate(exc, self.schema)


def _document_twin(sync: type, twin: type) -> None:
    """Give each public method of `twin` the docstring of its `sync` namesake: the docs are
    written once, on Queue, and AsyncQueue's cannot drift from them (the twins test checks)."""
    for name, member in vars(twin).items():
        written = getattr(vars(sync).get(name), "__doc__", None)
        if not name.startswith("_") and written and not member.__doc__:
            member.__doc__ = written


_document_twin(Queue, AsyncQueue)


class _AsyncPooled:
    """A pooled connection that commits on success, like ConnectionPool.connection()."""

    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue
        self._cm: Any = None

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._cm = (await self.queue.pool()).connection()
        conn: psycopg.AsyncConnection[Any] = await self._cm.__aenter__()
        return conn

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._cm.__aexit__(kind, exc, tb)
        except BaseException as commit_failed:
            _translate(commit_failed, self.queue.schema)
            raise
        _translate(exc, self.queue.schema)
