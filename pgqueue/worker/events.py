"""What a worker's services tell each other, and the bus that carries it.

Owns: the events (small frozen dataclasses, one per thing that happened) and `Bus`, one per
run of a worker. A service publishes what it saw; the parts that react (the claimer, the wake
interest, the fetch loop) subscribe to the kinds they care about. No service calls back into
the worker, and none needs to know who listens.

Invariants:
- `publish` runs on the bus's event loop and delivers at once, to each subscriber of the
  event's kind in the order they subscribed, before it returns; a subscriber that raises
  raises out of `publish`, to the service that published.
- `publish_threadsafe` is for a service that runs in a thread of its own (the heartbeat): the
  event is delivered on the loop, soon, as `publish` would. Once the loop has closed there is
  nobody left to hear it, and the event is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from pgqueue.wakeup import Position


@dataclass(frozen=True)
class JobsAnnounced:
    """A wake-up: jobs became claimable in `queue` at `position` or after it (None: where is
    not known)."""

    queue: str
    position: Position | None


@dataclass(frozen=True)
class Relistened:
    """The notifier listens (again): wake-ups and pause notices sent meanwhile were missed."""


@dataclass(frozen=True)
class CancelRequested:
    """Someone asked that job `job_id` stop, if it runs here."""

    job_id: int


@dataclass(frozen=True)
class PauseChanged:
    """A served `queue` was paused (or resumed, `paused` False)."""

    queue: str
    paused: bool


@dataclass(frozen=True)
class ControlsChanged:
    """A rate limit concerning `queue` was set or removed ('*': a task's or a key's)."""

    queue: str


@dataclass(frozen=True)
class WorkerRevived:
    """The heartbeat put back this worker's row, removed as dead: the rows that went with it
    (which wake-ups it wants) must be written again."""


@dataclass(frozen=True)
class JobsClaimable:
    """Jobs may have become claimable, where is not known (a rescue, a put-back)."""


Event: TypeAlias = (
    JobsAnnounced
    | Relistened
    | CancelRequested
    | PauseChanged
    | ControlsChanged
    | WorkerRevived
    | JobsClaimable
)
E = TypeVar("E", bound=Event)


class Bus:
    """Delivers each event to the subscribers of its kind, on `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._subscribers: dict[type[Any], list[Callable[[Any], None]]] = {}

    def subscribe(self, kind: type[E], handler: Callable[[E], None]) -> None:
        """Call `handler` with every event of `kind` published from now on."""
        self._subscribers.setdefault(kind, []).append(handler)

    def publish(self, event: Event) -> None:
        """Deliver `event` now; call on the bus's loop."""
        for handler in self._subscribers.get(type(event), ()):
            handler(event)

    def publish_threadsafe(self, event: Event) -> None:
        """Deliver `event` on the bus's loop, from any thread."""
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.publish, event)
        except RuntimeError:  # the loop closed after the look above
            return
