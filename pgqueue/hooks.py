"""Hooks: where an integration plugs into the core, so that the core imports none of them.

Owns every protocol an integration implements or reads. Around enqueues: the two kinds of
hook and their registry. An `EnqueueHook` is around each batch of
jobs an enqueue stores (tracing opens its span there, and the jobs' rows carry its context);
a `ConnectionAdapter` gives the psycopg connection under another library's connection object,
so that `conn=` takes it (pgqueue/contrib/sqlalchemy.py is one).

Invariants: with no enqueue hook registered, an enqueue pays one check. A Queue's own hooks
(`Queue(hooks=[...])`) run for its enqueues only, inside the registered ones. An adapter is found by
the top-level package of the object's type: a registered one first, else the one an installed
distribution declares under the entry point group `pgqueue.connection_adapters`, named after
that package (pgqueue declares SQLAlchemy's), loaded the first time such an object is passed.
Registering a hook twice registers it once. Registering something that is neither kind of
hook raises ConfigurationError.

Around a worker: a `JobObserver` is told of each job a worker starts and finishes
(`AttemptOutcome`, the public face of the worker's outcome) and of each claim, and, with a
`step_event` method, of each durable call (`StepEvent`); a `JobMiddleware` wraps each
attempt's handler (`Worker(middleware=[...])`), where an observer only watches; an
`ObservedWorker` is what metrics read of a worker (`pgqueue.Worker` is one). Metrics
(pgqueue/metrics.py), traces (pgqueue/tracing.py) and the worker's own log
(pgqueue/worker/observe.py) are observers, so none of them needs to import the worker's
runtime.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import psycopg

from pgqueue.errors import ConfigurationError
from pgqueue.models import ClaimedJob, NewJob

ADAPTER_GROUP = "pgqueue.connection_adapters"


@runtime_checkable
class EnqueueHook(Protocol):
    """Around each enqueue call that stores jobs."""

    def enqueue(self, batch: Sequence[NewJob]) -> AbstractContextManager[list[int]]:
        """A context entered before `batch` is stored, in the caller's thread and context,
        and exited after: it yields a list that holds the jobs' ids, in order, once they are
        stored (empty if storing them raised, which then propagates through it).

        A hook that also has a `carrier()` method gives the stored jobs' rows their trace
        context: called inside this context, before the jobs are stored, it returns the
        context as W3C trace context's fields (a dict of strings) or None. Of several such
        hooks, the innermost gives it."""
        ...


@runtime_checkable
class ConnectionAdapter(Protocol):
    """The psycopg connection under another library's connection objects."""

    # The top-level package of the objects it takes ("sqlalchemy").
    library: str

    def connection(self, conn: object) -> psycopg.Connection[Any]:
        """The psycopg connection under `conn`, in the transaction `conn` has open (begun as
        `conn` would begin it). Raises ConfigurationError for an object it cannot take."""
        ...

    async def async_connection(self, conn: object) -> psycopg.AsyncConnection[Any]:
        """`connection` for AsyncQueue's objects."""
        ...


Hook = EnqueueHook | ConnectionAdapter

_enqueue_hooks: tuple[EnqueueHook, ...] = ()
_adapters: dict[str, ConnectionAdapter] = {}


def register(hook: Hook) -> None:
    """Call `hook` from now on, in this process: an EnqueueHook on every enqueue, after those
    registered before it; a ConnectionAdapter for its library's objects, in place of any
    adapter registered for that library before."""
    global _enqueue_hooks
    known = False
    if isinstance(hook, EnqueueHook):
        known = True
        if hook not in _enqueue_hooks:
            _enqueue_hooks = (*_enqueue_hooks, hook)
    if isinstance(hook, ConnectionAdapter):
        known = True
        _adapters[hook.library] = hook
    if not known:
        raise ConfigurationError(
            f"{hook!r} is not a pgqueue hook: an enqueue hook has an enqueue(batch) method, "
            "a connection adapter a library name and connection(conn) and "
            "async_connection(conn) methods"
        )


def unregister(hook: Hook) -> None:
    """Stop calling `hook`; nothing happens if it is not registered."""
    global _enqueue_hooks
    _enqueue_hooks = tuple(h for h in _enqueue_hooks if h is not hook)
    if isinstance(hook, ConnectionAdapter) and _adapters.get(hook.library) is hook:
        del _adapters[hook.library]


def enqueue_hooks(given: Sequence[EnqueueHook]) -> tuple[EnqueueHook, ...]:
    """The enqueue hooks given to one Queue, checked, each once, in order; ConfigurationError
    for one that is not an enqueue hook."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise ConfigurationError(f"hooks= takes a list of enqueue hooks, got {given!r}")
    for hook in given:
        if not isinstance(hook, EnqueueHook):
            raise ConfigurationError(
                f"{hook!r} is not an enqueue hook: hooks= takes objects with an "
                "enqueue(batch) method (pgqueue.hooks.EnqueueHook)"
            )
    return tuple(hook for i, hook in enumerate(given) if hook not in given[:i])


class Enqueuing:
    """One enqueue call inside its hooks: the caller stores the jobs with `trace_context`
    (JSON text for the rows' trace_context column, or None), then puts their ids in `ids`,
    in order, before the hooks exit."""

    __slots__ = ("ids", "trace_context")

    def __init__(self, trace_context: str | None) -> None:
        self.ids: list[int] = []
        self.trace_context = trace_context


def enqueuing(
    batch: Sequence[NewJob], own: tuple[EnqueueHook, ...] = ()
) -> AbstractContextManager[Enqueuing] | None:
    """The registered enqueue hooks around `batch`, then a queue's `own`, each inside the
    ones before it, as one context; None when there is no hook. A hook both registered and a
    queue's runs once, as registered."""
    around = _enqueue_hooks
    if own:
        around += tuple(hook for hook in own if hook not in _enqueue_hooks)
    if not around:
        return None
    return _nested(around, batch)


@contextmanager
def _nested(hooks: Sequence[EnqueueHook], batch: Sequence[NewJob]) -> Iterator[Enqueuing]:
    with ExitStack() as stack:
        seen = [stack.enter_context(hook.enqueue(batch)) for hook in hooks]
        call = Enqueuing(_carried(hooks))
        yield call
        for each in seen:
            each.extend(call.ids)


def _carried(hooks: Sequence[EnqueueHook]) -> str | None:
    for hook in reversed(hooks):
        carrier = getattr(hook, "carrier", None)
        if carrier is not None and (found := carrier()) is not None:
            return json.dumps(found)
    return None


def adapter_for(conn: object) -> ConnectionAdapter | None:
    """The adapter for `conn`'s library: registered, or declared by an installed
    distribution; None when there is none."""
    library = type(conn).__module__.partition(".")[0]
    found = _adapters.get(library)
    if found is None:
        for point in entry_points(group=ADAPTER_GROUP, name=library):
            found = point.load()
            register(found)  # refuses what is not an adapter
            break
    return found


# -- what a worker tells observers, and what metrics read of it ------------------------------


class AttemptOutcome(Protocol):
    """How one attempt of a job ended, as observers read it (the worker's Outcome)."""

    @property
    def status(self) -> str:
        """succeeded, failed, retry or cancelled."""
        ...

    @property
    def duration(self) -> float | None:
        """Seconds the attempt ran; None when nobody saw it end (a rescued job)."""
        ...

    @property
    def error(self) -> dict[str, Any] | None:
        """The recorded error (its "error", "type", "traceback"), for an attempt that failed."""
        ...

    @property
    def retry_in(self) -> float:
        """Seconds until the next attempt, for a retry."""
        ...

    @property
    def snooze(self) -> bool:
        """A retry that gives its attempt back (a Snooze, a durable sleep)."""
        ...


# Outcome.status as observers name it: a retry is "retried", a snooze "snoozed".
def outcome_name(outcome: AttemptOutcome) -> str:
    if outcome.status == "retry":
        return "snoozed" if outcome.snooze else "retried"
    return outcome.status


class JobObserver(Protocol):
    """Told of each job a worker starts and finishes, and of each claim statement. An
    observer that also has a `step_event(event: StepEvent)` method is told of each durable
    call of a job (pgqueue/worker/durable.py) too."""

    def job_started(self, job: ClaimedJob) -> None: ...

    def job_finished(self, job: ClaimedJob, outcome: AttemptOutcome) -> None: ...

    def claimed(self, seconds: float, jobs: int) -> None: ...


class JobMiddleware(Protocol):
    """Around each attempt of a job in a worker: an `async` callable taking the claimed job
    and `call_next`, which runs the rest of the chain (the next middleware, and last the
    handler) and returns the handler's result or raises its exception. What the middleware
    returns is the attempt's result; what it raises ends the attempt as the handler's
    exception would (a retry under the task's policy, a `Snooze`...). It may run code
    before and after, catch what `call_next` raises, not call it (the handler does not run),
    or call it again (the handler runs again, in the same attempt). The first middleware of
    the list is the outermost."""

    def __call__(
        self, job: ClaimedJob, call_next: Callable[[], Awaitable[Any]]
    ) -> Awaitable[Any]: ...


def job_middleware(given: Sequence[JobMiddleware]) -> tuple[JobMiddleware, ...]:
    """A worker's middleware, checked, in order; ConfigurationError for one that is not an
    async callable."""
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise ConfigurationError(f"middleware= takes a list of job middleware, got {given!r}")
    for each in given:
        if not callable(each) or not (
            inspect.iscoroutinefunction(each) or inspect.iscoroutinefunction(each.__call__)
        ):
            raise ConfigurationError(
                f"{each!r} is not job middleware: middleware= takes async callables "
                "(job, call_next) (pgqueue.hooks.JobMiddleware)"
            )
    return tuple(given)


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What a job's durable call did, told in the handler's thread or task, between the
    job's job_started and job_finished.

    `what`, by kind: a step is "started" then "recorded" (or "failed", with `error`, when its
    function raised or its result could not be recorded); a sleep is "recorded" when it
    begins, then "sleeping" each time it gives back the job's slot (with `until`); a wait for
    a signal is "parked" when the job parks (with `key` and its timeout as `until`),
    "recorded" when it takes a signal, "timed out" when its timeout passed first. Any of
    them is "replayed" when a run of the job returns what an earlier one recorded, and
    "mismatch" when it finds another call recorded there (the job then fails)."""

    job: ClaimedJob
    seq: int
    name: str
    kind: str  # step, sleep or signal
    what: str
    duration: float | None = None  # seconds, for a step recorded or failed
    until: datetime | None = None
    key: str | None = None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What one worker holds now, as a metrics scrape reads it."""

    running: int  # jobs it runs, lease and atomic
    free_slots: int  # jobs it could start now: its concurrency less its lease jobs running
    rescued: int  # jobs of dead workers it put back or failed since it started


class ObservedWorker(Protocol):
    """A worker as metrics read it: `pgqueue.Worker` is one."""

    schema: str

    def add_observer(self, observer: JobObserver) -> None:
        """Tell `observer` of this worker's jobs from now on, for every run."""
        ...

    def load(self) -> WorkerLoad:
        """What the worker holds now; cheap, read at each scrape."""
        ...
