"""`Queue`, the sync client: each method runs a plan of pgqueue/queue/base.py on a connection."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

import psycopg
from psycopg_pool import ConnectionPool

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
from pgqueue.queue.base import T, _Base, _names
from pgqueue.queue.connections import _adapter, _alone, _connect, _require, _usable
from pgqueue.queue.outcomes import JobHandle, JobOutcome, WorkflowHandle
from pgqueue.queue.waiting import STARTING, BackgroundWaiters, WaitSettings, new_hub
from pgqueue.registry import EnqueueOptions, Task
from pgqueue.store import jobs as jobs_store
from pgqueue.store import outbox as outbox_store
from pgqueue.store.plan import run
from pgqueue.tenants import (
    ConcurrencyLimit,
    FairShare,
    limit_key,
)
from pgqueue.workflow import Flow, OnFailure

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from pgqueue.queue.base import Conn
    from pgqueue.queue.plans import _JobFilters


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
        hooked = hooks.enqueuing(batch, self.enqueue_hooks)
        if hooked is None:
            return self._store(batch, conn)
        with hooked as call:
            call.ids.extend(ids := self._store(batch, conn, call.trace_context))
            return ids

    def _store(
        self, batch: Sequence[NewJob], conn: Conn | None, traced: str | None = None
    ) -> list[Enqueued]:
        with self._connection(conn) as c:
            if jobs_store.keyed(batch):
                return run(c, self._enqueue_plan(batch, traced))
            if bulk.copyable(batch, c):
                limit = self.settings.max_payload_bytes
                return jobs_store.copy_in(c, batch, self.schema, limit, traced)
            own = conn is None and self._borrow is None
            statement, params = self._insert(batch, own or _alone(c), traced)
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

    # Waiting for results (pgqueue/queue/waiting.py, pgqueue/queue/outcomes.py): every wait of this
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
        plan = self._signal_plan(key, payload)
        with self._connection(conn) as c:
            return run(c, plan)


class _Borrowed:
    """The caller's connection as a context manager that leaves its transaction alone."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn
        self.schema = schema

    def __enter__(self) -> psycopg.Connection[Any]:
        _usable(self.conn)
        return self.conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        translate(exc, self.schema)


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
            translate(commit_failed, self.schema)
            raise
        translate(exc, self.schema)
