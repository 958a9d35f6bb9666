"""A django.tasks job's run in a pgqueue worker: the handler pgqueue calls for it, which
sends Django's task_started and task_finished signals around the function, with the
TaskResult of the attempt running, and hands the outcome back to pgqueue (a raise fails or
retries the job, as the task's backend's MAX_ATTEMPTS says).

Django's documented contract: TaskResult.attempts counts the attempts run, leaving out the
one running; TaskContext.attempt is the running one's number, from 1; started_at is the
first attempt's start (stored with the job on attempt 1 when another attempt may follow),
last_attempted_at the latest's.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from pgqueue.contrib.django import project as integration
from pgqueue.errors import ConfigurationError
from pgqueue.registry import JobContext
from pgqueue.store import django_tasks


def runner(task: DjangoTask, kind: type[BaseTaskBackend]) -> Any:
    """The pgqueue handler of `task`, whose backends are of the class `kind` (tasks.Backend)."""

    def run(
        job: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        backend: str,
        enqueued_at: datetime,
        run_after: datetime | None = None,
        started_at: datetime | None = None,
    ) -> Any:
        close_old_connections()  # as a request would: a worker's connections outlive many
        try:
            attempt = _Attempt(
                task, kind, job, args, kwargs, backend, enqueued_at, run_after, started_at
            )
            if attempt.keeps_first_start:
                _keep_first_start(job, attempt.started_at)
            task_started.send(attempt.sender, task_result=attempt.result)
            try:
                attempt.succeeded(attempt.call())
            except (Exception, SystemExit) as exc:  # Django's own backends record SystemExit
                attempt.failed(exc)
                task_finished.send(attempt.sender, task_result=attempt.result)
                raise
            task_finished.send(attempt.sender, task_result=attempt.result)
            return attempt.value
        finally:
            close_old_connections()

    return run


def async_runner(task: DjangoTask, kind: type[BaseTaskBackend]) -> Any:
    """`runner` for a task whose function is a coroutine."""

    async def run(
        job: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        backend: str,
        enqueued_at: datetime,
        run_after: datetime | None = None,
        started_at: datetime | None = None,
    ) -> Any:
        attempt = _Attempt(
            task, kind, job, args, kwargs, backend, enqueued_at, run_after, started_at
        )
        if attempt.keeps_first_start:
            await sync_to_async(_keep_first_start)(job, attempt.started_at)
        await task_started.asend(attempt.sender, task_result=attempt.result)
        try:
            attempt.succeeded(await attempt.call())
        except (Exception, SystemExit) as exc:
            attempt.failed(exc)
            await task_finished.asend(attempt.sender, task_result=attempt.result)
            raise
        await task_finished.asend(attempt.sender, task_result=attempt.result)
        return attempt.value

    return run


def _keep_first_start(job: JobContext, at: datetime) -> None:
    """Store attempt 1's start with the job, whose row keeps only the latest attempt's: a
    later attempt's TaskResult.started_at is still the first attempt's, as Django documents."""
    schema = integration.queue().schema
    django_tasks.keep_first_start(integration.connection(), schema, job.job_id, job.worker_id, at)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _RunningContext(TaskContext):
    """The TaskContext of a running attempt. Django documents TaskContext.attempt as the
    current attempt's number, from 1, and TaskResult.attempts as the attempts run, the
    current one not counted: the same number cannot serve both while it runs."""

    number: int

    @property
    def attempt(self) -> int:
        return self.number


class _Attempt:
    """One run of a django.tasks task in a worker, and the TaskResult its signals carry."""

    def __init__(
        self,
        task: DjangoTask,
        kind: type[BaseTaskBackend],
        job: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        alias: str,
        enqueued_at: datetime,
        run_after: datetime | None,
        first_started_at: datetime | None,
    ) -> None:
        backend = task_backends[alias]
        if not isinstance(backend, kind):
            raise ConfigurationError(f"TASKS[{alias!r}] is no longer a pgqueue backend")
        self.sender = type(backend)
        self.job = job
        self.task = dataclasses.replace(
            task, backend=alias, queue_name=job.queue, run_after=run_after
        )
        self.args, self.kwargs = args, kwargs
        now = timezone.now()
        # Only the first attempt is stored (and only when there may be another).
        self.keeps_first_start = job.attempt == 1 and job.max_attempts > 1
        self.started_at = first_started_at if job.attempt > 1 and first_started_at else now
        self.value: Any = None
        self.result = TaskResult(
            task=self.task,
            id=str(job.job_id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=enqueued_at,
            started_at=self.started_at,
            finished_at=None,
            last_attempted_at=now,
            args=args,
            kwargs=kwargs,
            backend=alias,
            errors=[],
            # One entry per attempt run before this one: who ran them is not read here
            # (get_result has it from the job's errors). This one counts once it ends.
            worker_ids=[str(job.worker_id)] * (job.attempt - 1),
        )

    def call(self) -> Any:
        if self.task.takes_context:
            context = _RunningContext(task_result=self.result, number=self.job.attempt)
            return self.task.func(context, *self.args, **self.kwargs)
        return self.task.func(*self.args, **self.kwargs)

    def succeeded(self, value: Any) -> None:
        self.value = normalize_json(value)
        self._ended(status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
        object.__setattr__(self.result, "_return_value", self.value)

    def failed(self, exc: BaseException) -> None:
        final = self.job.attempt >= self.job.max_attempts
        kind = type(exc)
        self.result.errors.append(
            TaskError(
                exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                traceback="".join(_format(exc)),
            )
        )
        if final:
            self._ended(status=TaskResultStatus.FAILED, finished_at=timezone.now())
        else:
            self._ended(status=TaskResultStatus.READY)

    def _ended(self, **values: Any) -> None:
        self.result.worker_ids.append(str(self.job.worker_id))
        for name, value in values.items():
            object.__setattr__(self.result, name, value)


def _format(exc: BaseException) -> list[str]:
    import traceback

    return traceback.format_exception(exc)
