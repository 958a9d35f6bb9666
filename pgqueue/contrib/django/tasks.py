"""Django's task API (`django.tasks`, Django 6) on pgqueue.

    TASKS = {"default": {"BACKEND": "pgqueue.contrib.django.Backend"}}

`task.enqueue(...)` writes the job on Django's own connection, so it commits and rolls back
with the `transaction.atomic()` block around it; `manage.py pgqueue_worker` runs it. A
django.tasks job is a pgqueue job like any other: its task name is the function's module
path, and `pgqueue jobs`, retries, cancel and retention apply to it.

What the worker runs: only functions decorated with `@task` for a pgqueue backend, in the
modules of installed apps (and of OPTIONS["MODULES"]), looked up the first time a job names
them. A job naming anything else fails with the reason.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import close_old_connections, transaction
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from pgqueue.contrib import django as integration
from pgqueue.errors import ConfigurationError, InvalidArgumentsError
from pgqueue.models import MAX_ATTEMPTS_LIMIT, Job, JobOptions, JobStatus, TaskPolicy
from pgqueue.registry import JobContext, Task
from pgqueue.store import django_tasks

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
        _check_annotations(task, args, kwargs)
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


_queue_names: set[str] = set()  # those pgqueue accepts, checked once each


def install() -> None:
    """Let the project's Queue find django.tasks tasks for its workers (idempotent)."""
    integration.queue().registry.fallback = resolve


def resolve(name: str) -> Task[Any] | None:
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


_handlers: dict[str, Task[Any]] = {}


def _handler(task: DjangoTask) -> Task[Any]:
    """The pgqueue task for a django.tasks task: made once per module path."""
    name = task.module_path
    handler = _handlers.get(name)
    if handler is None:
        run = _async_runner(task) if inspect.iscoroutinefunction(task.func) else _runner(task)
        handler = Task(run, name=name, options=JobOptions(), policy=TaskPolicy())
        handler = _handlers.setdefault(name, handler)
    return handler


def _runner(task: DjangoTask) -> Any:
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
            attempt = _Attempt(task, job, args, kwargs, backend, enqueued_at, run_after, started_at)
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


def _async_runner(task: DjangoTask) -> Any:
    async def run(
        job: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        backend: str,
        enqueued_at: datetime,
        run_after: datetime | None = None,
        started_at: datetime | None = None,
    ) -> Any:
        attempt = _Attempt(task, job, args, kwargs, backend, enqueued_at, run_after, started_at)
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
        job: JobContext,
        args: list[Any],
        kwargs: dict[str, Any],
        alias: str,
        enqueued_at: datetime,
        run_after: datetime | None,
        first_started_at: datetime | None,
    ) -> None:
        backend = task_backends[alias]
        if not isinstance(backend, Backend):
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
    first_start = stored.get("started_at") if job.attempt >= 1 else None
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


@dataclasses.dataclass(frozen=True)
class _Parameters:
    """A task function's parameters as enqueue checks them (made once per function)."""

    signature: inspect.Signature  # without the context parameter
    variadic: frozenset[str]  # *args and **kwargs: Django's JSON check is all they get
    model: type[BaseModel] | None  # the annotated ones, None when none is


_parameters: dict[Any, _Parameters] = {}


def _check_annotations(task: DjangoTask, args: list[Any], kwargs: dict[str, Any]) -> None:
    """pgqueue's check beside Django's: the arguments fit the function's parameters, and
    its annotated ones take these JSON values, at enqueue rather than when the job runs."""
    found = _parameters.get(task.func)
    if found is None:
        found = _parameters.setdefault(task.func, _read_parameters(task))
    try:
        bound = found.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentsError(f"task {task.module_path!r}: {exc}") from None
    if found.model is None:
        return
    values = {k: v for k, v in bound.arguments.items() if k not in found.variadic}
    try:
        found.model.model_validate_json(json.dumps(values), strict=True)
    except ValidationError as exc:
        raise InvalidArgumentsError(
            f"task {task.module_path!r}: invalid arguments: {exc}"
        ) from None


def _read_parameters(task: DjangoTask) -> _Parameters:
    signature = inspect.signature(task.func)
    params = list(signature.parameters.values())[1 if task.takes_context else 0 :]
    try:
        hints = typing.get_type_hints(task.func)
    except Exception:  # an annotation that does not resolve checks nothing
        hints = {}
    variadic = frozenset(p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
        for p in params
        if p.name not in variadic
    }
    model = None
    if any(p.name in hints for p in params):
        model = create_model(
            f"{task.module_path}:args",
            __config__=ConfigDict(arbitrary_types_allowed=True),
            **fields,
        )
    return _Parameters(signature.replace(parameters=params), variadic, model)
