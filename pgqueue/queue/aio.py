"""`AsyncQueue`, the async twin of `Queue`: the same methods, awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgqueue import bulk, hooks, migrate
from pgqueue import dsn as dsn_rule
from pgqueue.errors import (
    ConfigurationError,
    translate,
)
from pgqueue.models import (
    Cancellation,
    DeadMessage,
    Enqueued,
    EnqueuedWorkflow,
    Job,
    JobPage,
    JobSteps,
    Message,
    NewJob,
    OutboxStats,
    QueuePause,
    RateLimit,
    Workflow,
)
from pgqueue.queue import outcomes
from pgqueue.queue.arguments import (
    _jobs_only,
    _message,
    _task_name,
    _workflow_jobs,
    _workflow_jobs_ended,
)
from pgqueue.queue.base import (
    P,
    R,
    T,
    TaskT,
    _AsyncRegistering,
    _AsyncScheduling,
    _Base,
    _document_twin,
    _names,
)
from pgqueue.queue.connections import (
    _adapter,
    _alone,
    _connect_async,
    _require,
    _running_loop,
    _usable,
)
from pgqueue.queue.outcomes import JobHandle, JobOutcome, WorkflowHandle
from pgqueue.queue.sync import Queue
from pgqueue.queue.waiting import Waiters, WaitSettings, new_hub
from pgqueue.registry import AsyncTask, EnqueueOptions, Task
from pgqueue.store import jobs as jobs_store
from pgqueue.store import outbox as outbox_store
from pgqueue.store.plan import run_async
from pgqueue.tenants import (
    ConcurrencyLimit,
    FairShare,
    limit_key,
)
from pgqueue.workflow import Flow, OnFailure

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from pgqueue.queue.base import (
        AsyncConn,
        _ContextFirst,
        _PeriodicOptions,
        _TaskOptions,
        _WithContext,
    )
    from pgqueue.queue.plans import _JobFilters


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
        hooked = hooks.enqueuing(batch, self.enqueue_hooks)
        if hooked is None:
            return await self._store(batch, conn)
        with hooked as call:
            call.ids.extend(ids := await self._store(batch, conn, call.trace_context))
            return ids

    async def _store(
        self, batch: Sequence[NewJob], conn: AsyncConn | None, traced: str | None = None
    ) -> list[Enqueued]:
        async with self._connection(conn) as c:
            if jobs_store.keyed(batch):
                return await run_async(c, self._enqueue_plan(batch, traced))
            if bulk.copyable(batch, c):
                limit = self.settings.max_payload_bytes
                return await jobs_store.copy_in_async(c, batch, self.schema, limit, traced)
            own = conn is None and self._borrow is None
            statement, params = self._insert(batch, own or _alone(c), traced)
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
        plan = self._signal_plan(key, payload)
        async with self._connection(conn) as c:
            return await run_async(c, plan)


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
        translate(exc, self.schema)


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
            translate(commit_failed, self.queue.schema)
            raise
        translate(exc, self.queue.schema)


_document_twin(Queue, AsyncQueue)
