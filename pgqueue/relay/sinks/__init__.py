"""Where `pgqueue relay` publishes staged messages: one sink per broker, named in a message's
destination ("sink:target").

A sink's `publish` takes messages of one destination sink, in the order they must keep, and
returns, for each, None once the broker has confirmed it, or the reason the broker refused it
for good (the message goes to the dead letters). Any exception means the broker is away or
refusing for now: the relay keeps every message of that call and tries again with backoff.
A sink for a broker is an optional extra (pgqueue.sinks.redis, ...); this module imports
none of them.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Outgoing:
    """A message on its way out. `message_id` is stable across a re-publish: put it in the
    broker's own id field, so that consumers can drop a duplicate."""

    id: int
    target: str
    key: str | None
    message: Any
    headers: dict[str, str] | None
    message_id: str


class Refused(Exception):
    """Raised by a CallableSink's function: the message can never be published (too large,
    no route), and goes to the dead letters with this reason."""


class Sink(Protocol):
    async def open(self) -> None:
        """Connect; called once before the first publish."""

    async def close(self) -> None:
        """Disconnect; called once when the relay stops."""

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        """Publish in order and wait for the broker's confirmation of each; per message,
        None if confirmed or the reason it was refused for good. Raise if the broker cannot
        take them now."""
        ...


class CallableSink:
    """A sink that calls `fn(message)` for each message in turn: a webhook, a Kafka
    producer of your own, anything with a client. `fn` may be `def` (run in a thread) or
    `async def`; it returns once the message is safely handed over, raises `Refused` for a
    message that can never go, and raises anything else to have it retried later."""

    def __init__(self, fn: Callable[[Outgoing], Any | Awaitable[Any]]) -> None:
        self.fn = fn
        self._is_async = inspect.iscoroutinefunction(fn)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        outcomes: list[str | None] = []
        for message in messages:
            try:
                if self._is_async:
                    await self.fn(message)
                else:
                    await asyncio.to_thread(self.fn, message)
            except Refused as refused:
                outcomes.append(str(refused) or "refused")
                continue
            outcomes.append(None)
        return outcomes
