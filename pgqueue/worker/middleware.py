"""The worker's job middleware around each call of a handler (pgqueue.hooks.JobMiddleware).

Owns: the chain, the first middleware outermost and the handler innermost, each link a
`call_next` that runs the rest. A `def` atomic task's handler runs in its lane's thread,
inside the transaction of that thread's connection, so its chain runs there too, on an event
loop of that thread's own. With no middleware nothing here runs: the executor calls the
handler itself, at no cost.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from pgqueue.hooks import JobMiddleware
from pgqueue.models import ClaimedJob


def chained(
    middleware: tuple[JobMiddleware, ...], job: ClaimedJob, handler: Callable[[], Awaitable[Any]]
) -> Awaitable[Any]:
    """`handler` (which calls the job's handler anew each time) inside `middleware`."""
    call = handler
    for each in reversed(middleware):
        call = functools.partial(each, job, call)
    return call()


def chained_in_thread(
    middleware: tuple[JobMiddleware, ...], job: ClaimedJob, handler: Callable[[], Any]
) -> Any:
    """The chain around a sync `handler`, run to its end in the calling thread, which has
    no event loop running (an atomic lane's)."""

    async def inline() -> Any:
        return handler()

    async def chain() -> Any:
        return await chained(middleware, job, inline)

    return asyncio.run(chain())
