"""Hooks: where an integration plugs into the core, so that the core imports none of them.

Owns: the two kinds of hook and their registry. An `EnqueueHook` is around each batch of
jobs an enqueue stores (tracing opens its span there, and the jobs' rows carry its context);
a `ConnectionAdapter` gives the psycopg connection under another library's connection object,
so that `conn=` takes it (pgqueue/contrib/sqlalchemy.py is one).

Invariants: with no enqueue hook registered, an enqueue pays one check. An adapter is found by
the top-level package of the object's type: a registered one first, else the one an installed
distribution declares under the entry point group `pgqueue.connection_adapters`, named after
that package (pgqueue declares SQLAlchemy's), loaded the first time such an object is passed.
Registering a hook twice registers it once. Registering something that is neither kind of
hook raises ConfigurationError.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import psycopg

from pgqueue.errors import ConfigurationError
from pgqueue.models import NewJob

ADAPTER_GROUP = "pgqueue.connection_adapters"


@runtime_checkable
class EnqueueHook(Protocol):
    """Around each enqueue call that stores jobs."""

    def enqueue(self, batch: Sequence[NewJob]) -> AbstractContextManager[list[int]]:
        """A context entered before `batch` is stored, in the caller's thread and context,
        and exited after: it yields a list that holds the jobs' ids, in order, once they are
        stored (empty if storing them raised, which then propagates through it)."""
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


def enqueuing(batch: Sequence[NewJob]) -> AbstractContextManager[list[int]] | None:
    """The registered enqueue hooks around `batch`, as one context whose list the caller
    fills with the stored jobs' ids; None when no hook is registered."""
    if not _enqueue_hooks:
        return None
    if len(_enqueue_hooks) == 1:
        return _enqueue_hooks[0].enqueue(batch)
    return _nested(_enqueue_hooks, batch)


@contextmanager
def _nested(hooks: Sequence[EnqueueHook], batch: Sequence[NewJob]) -> Iterator[list[int]]:
    with ExitStack() as stack:
        seen = [stack.enter_context(hook.enqueue(batch)) for hook in hooks]
        ids: list[int] = []
        yield ids
        for each in seen:
            each.extend(ids)


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
