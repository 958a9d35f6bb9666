"""Django's task API (`django.tasks`, Django 6) on pgqueue.

    TASKS = {"default": {"BACKEND": "pgqueue.contrib.django.Backend"}}

`task.enqueue(...)` writes the job on Django's own connection, so it commits and rolls back
with the `transaction.atomic()` block around it; `manage.py pgqueue_worker` runs it. A
django.tasks job is a pgqueue job like any other: its task name is the function's module
path, and `pgqueue jobs`, retries, cancel and retention apply to it.

What the worker runs: only functions decorated with `@task` for a pgqueue backend, in the
modules of installed apps (and of OPTIONS["MODULES"]), looked up the first time a job names
them. A job naming anything else fails with the reason. Only pgqueue's own TASKS entries are
read for that, from the setting: as in Django, another alias is resolved only when used.
What `--queues all` serves is found ahead of any job (task_discovery.py).

`wait_result(result)` (and `await_result`) block until a task has finished and refresh its
result, hearing of the finish through pgqueue's waits rather than by polling.

task_enqueued is sent when the enqueue commits; the worker's side (task_runs.py) sends the
others. task_args.py holds pgqueue's check of the arguments at enqueue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import threading
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import transaction
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from pydantic import ValidationError

from pgqueue.contrib.django import project as integration
from pgqueue.contrib.django import task_args, task_discovery, task_runs
from pgqueue.errors import (
    ConfigurationError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
)
from pgqueue.models import MAX_ATTEMPTS_LIMIT, Job, JobOptions, JobStatus, TaskPolicy
from pgqueue.queue import Queue
from pgqueue.registry import Discovered, Task

_STATUS = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.WAITING: TaskResultStatus.READY,
    JobStatus.BLOCKED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


class Backend(BaseTaskBackend):
    """A django.tasks backend whose jobs are pgqueue jobs.

    OPTIONS: "MAX_ATTEMPTS" (default 1: a task that raises is FAILED, as with Django's own
    backends; more retries it with pgqueue's backoff, READY between attempts) and "MODULES",
    module prefixes outside installed apps whose tasks workers may run.
    Priority is Django's: higher runs first.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            attempts = 0
        if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] is a whole number from 1 to "
                f"{MAX_ATTEMPTS_LIMIT}"
            )
        self.max_attempts = attempts
        modules = self.options.get("MODULES", [])
        if not isinstance(modules, (list, tuple)) or not all(isinstance(m, str) for m in modules):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['MODULES'] is a list of module names"
            )
        self.modules = tuple(modules)
        install()

    def validate_task(self, task: DjangoTask) -> None:
        super().validate_task(task)
        if task.queue_name in _queue_names:
            return
        try:
            JobOptions(queue=task.queue_name)
        except (ValidationError, ConfigurationError) as exc:
            raise InvalidTask(
                f"queue_name {task.queue_name!r} is not a pgqueue queue name: {exc}"
            ) from None
        _queue_names.add(task.queue_name)

    def enqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        """Store the job on Django's connection, inside whatever transaction it has open."""
        self.validate_task(task)
        if not _allowed(task.module_path):
            raise InvalidTask(
                f"{task.module_path!r} is not in an installed app, so workers would not run "
                f"it: move it into one, or add its module to TASKS[{self.alias!r}]"
                "['OPTIONS']['MODULES']"
            )
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        handler = _handler(task)
        task_args.check_annotations(task, args, kwargs)
        enqueued_at = timezone.now()
        stored: dict[str, Any] = {
            "args": args,
            "kwargs": kwargs,
            "backend": self.alias,
            "enqueued_at": enqueued_at,
        }
        options: dict[str, Any] = {
            "queue": task.queue_name,
            "priority": -task.priority,  # Django's higher-first to pgqueue's lower-first
            "max_attempts": self.max_attempts,
        }
        if task.run_after is not None:
            options["run_at"] = task.run_after
            stored["run_after"] = task.run_after
        job = handler.job(**stored)
        job_id = integration.queue().enqueue(job, conn=integration.connection(), **options)
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # Django's signal says the task is enqueued, which is true once the job commits:
        # at once in autocommit, at the commit of the atomic() block around the enqueue, and
        # never if that block rolls back.
        transaction.on_commit(
            functools.partial(task_enqueued.send, type(self), task_result=result),
            using=integration.alias(),
        )
        return result

    def get_result(self, result_id: Any) -> TaskResult:
        """The job's TaskResult, read on Django's connection (so an uncommitted enqueue in
        the same transaction is found)."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 0 < job_id < 2**63:
            raise TaskResultDoesNotExist(result_id)
        job = integration.queue().get_job(job_id, conn=integration.connection())
        if job is None or not _is_django_job(job):
            raise TaskResultDoesNotExist(result_id)
        found = _django_task(job.task)
        if found is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: its task {job.task!r} is no longer a pgqueue django.tasks task"
            )
        return _result(found, job)


def wait_result(result: TaskResult, *, timeout: timedelta | float | None = None) -> TaskResult:
    """Block until the task has finished (SUCCESSFUL or FAILED), then refresh `result` and
    return it: a finish is heard at once through pgqueue's waits, without polling the
    result. A task that failed is not raised: its status and `errors` say so, as Django's
    results do. Raises pgqueue's WaitTimeoutError after `timeout` seconds (the task runs
    on) and TaskResultDoesNotExist if its job is gone. Call it outside the atomic block of
    the enqueue: the job is not there for a worker until that commits."""
    _wait(result, timeout)
    result.refresh()
    return result


async def await_result(
    result: TaskResult, *, timeout: timedelta | float | None = None
) -> TaskResult:
    """`wait_result` for async code: the wait runs beside the event loop, not on it."""
    await asyncio.to_thread(_wait, result, timeout)
    await result.arefresh()
    return result


def _wait(result: TaskResult, timeout: timedelta | float | None) -> None:
    try:
        job_id = int(result.id)
    except (TypeError, ValueError):
        raise TaskResultDoesNotExist(result.id) from None
    try:
        _waiting_queue().wait(job_id, timeout=timeout)
    except (JobFailedError, JobCancelledError):
        pass  # Django reports these through the result's status and errors
    except JobNotFoundError:
        raise TaskResultDoesNotExist(result.id) from None


def _waiting_queue() -> Queue:
    """The project's Queue if it has a DSN of its own; else one like it on Django's database,
    made once: waits listen on a connection of their own, which Django's cannot be."""
    project = integration.queue()
    if project.dsn is not None:
        return project
    dsn, settings = integration.dsn(), project.settings
    key = (dsn, settings.schema_name)
    with _WAITING_LOCK:
        found = _waiting.get(key)
        if found is None:
            found = _waiting[key] = Queue(
                dsn,
                schema=settings.schema_name,
                keep_history=settings.keep_history,
                prepare=settings.prepare,
            )
            found.wait_settings = project.wait_settings
        return found


_waiting: dict[tuple[str, str], Queue] = {}
_WAITING_LOCK = threading.Lock()
_queue_names: set[str] = set()  # those pgqueue accepts, checked once each


def install() -> None:
    """Let the project's Queue find django.tasks tasks for its workers (idempotent)."""
    registry = integration.queue().registry
    registry.fallback = resolve
    registry.discover = discover


def discover() -> Discovered:
    """The django.tasks tasks workers can run, and their queues, as the settings are now
    (task_discovery.py)."""
    return task_discovery.discover(_pgqueue_aliases(), _allowed)


def resolve(name: str) -> Task[..., Any] | None:
    """The pgqueue task that runs the django.tasks task at module path `name`, or None."""
    found = _django_task(name)
    return None if found is None else _handler(found)


def _allowed(name: str) -> bool:
    """Only modules of installed apps (and OPTIONS["MODULES"]) are imported for a job."""
    allowed = _allowed_names.get(name)
    if allowed is None:
        allowed = _allowed_names.setdefault(name, _in_allowed_modules(name))
    return allowed


_allowed_names: dict[str, bool] = {}


def _in_allowed_modules(name: str) -> bool:
    prefixes = [config.name for config in apps.get_app_configs()]
    for params in _pgqueue_aliases().values():
        modules = (params.get("OPTIONS") or {}).get("MODULES", [])
        if isinstance(modules, (list, tuple)):  # else the alias refuses itself when used
            prefixes.extend(m for m in modules if isinstance(m, str))
    return any(name.startswith(prefix + ".") for prefix in prefixes)


def _pgqueue_aliases() -> dict[str, dict[str, Any]]:
    """The TASKS entries whose BACKEND is pgqueue's, read from the setting: no backend is
    instantiated, so a broken alias of another backend stays Django's to report when it is
    used, as Django resolves aliases only then."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return {}
    return {
        alias: params
        for alias, params in configured.items()
        if isinstance(params, dict) and is_pgqueue_backend(params.get("BACKEND"))
    }


def is_pgqueue_backend(path: Any) -> bool:
    """Whether a TASKS entry's BACKEND names this backend (or a subclass of it)."""
    if not isinstance(path, str):
        return False
    try:
        found = import_string(path)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, Backend)


def _forget_allowed(*, setting: str, **kwargs: Any) -> None:
    """The allowed modules follow TASKS and INSTALLED_APPS when they change (tests do)."""
    if setting in ("TASKS", "INSTALLED_APPS"):
        _allowed_names.clear()


setting_changed.connect(_forget_allowed, dispatch_uid="pgqueue.contrib.django.tasks")


def _django_task(name: str) -> DjangoTask | None:
    if not _allowed(name):
        return None
    try:
        found = import_string(name)
    except (ImportError, AttributeError):
        return None
    if not isinstance(found, DjangoTask) or found.module_path != name:
        return None
    if not isinstance(found.get_backend(), Backend):
        return None
    return found


_handlers: dict[str, Task[..., Any]] = {}


def _handler(task: DjangoTask) -> Task[..., Any]:
    """The pgqueue task for a django.tasks task: made once per module path."""
    name = task.module_path
    handler = _handlers.get(name)
    if handler is None:
        coroutine = inspect.iscoroutinefunction(task.func)
        run = (task_runs.async_runner if coroutine else task_runs.runner)(task, Backend)
        handler = Task(run, name=name, options=JobOptions(), policy=TaskPolicy())
        handler = _handlers.setdefault(name, handler)
    return handler


def _is_django_job(job: Job) -> bool:
    args = job.args
    return isinstance(args, dict) and {"args", "kwargs", "backend", "enqueued_at"} <= set(args)


def _result(task: DjangoTask, job: Job) -> TaskResult:
    stored = job.args
    run_after = stored.get("run_after")
    task = dataclasses.replace(
        task,
        backend=stored["backend"],
        queue_name=job.queue,
        priority=-job.priority,
        run_after=datetime.fromisoformat(run_after) if run_after else None,
    )
    status = _STATUS[job.status]
    errors = [_task_error(e) for e in job.errors if e.get("kind") != "cancelled"]
    by_attempt = {e.get("attempt"): e.get("worker") for e in job.errors}
    # Attempts run: a running one counts once it ends, as Django documents.
    attempts = job.attempt - 1 if job.status == JobStatus.RUNNING else job.attempt
    worker_ids = [str(by_attempt.get(n) or job.worker_id) for n in range(1, attempts + 1)]
    # A later attempt's row has lost the first start, which attempt 1 stored with the job.
    first_start = stored.get("started_at") if job.attempt > 1 else None
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=datetime.fromisoformat(stored["enqueued_at"]),
        started_at=datetime.fromisoformat(first_start) if first_start else job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=stored["args"],
        kwargs=stored["kwargs"],
        backend=stored["backend"],
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _task_error(error: dict[str, Any]) -> TaskError:
    """A pgqueue error record as Django's TaskError: a worker's record names the exception's
    class; a lost or timed-out attempt's names pgqueue's reason."""
    path = error.get("type")
    if not isinstance(path, str):
        path = "pgqueue.errors.TaskError"
    traceback = error.get("traceback") or f"{error.get('error', '')}\n"
    return TaskError(exception_class_path=path, traceback=traceback)
