"""The one lifecycle every long-lived part of a worker has.

Owns: the `Service` protocol and the `Services` stack that runs it. A worker starts its
services one at a time, in order, each after the one it needs, and stops them in the reverse
order, so a part never outlives what it uses. A service owns only what its `start` opened, and
its `stop` closes that by a deadline. A failure while stopping one service is logged and the
rest still stop, so a worker's shutdown always reaches its end.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

log = logging.getLogger("pgqueue.worker")
STOP_SLACK = 1.0  # seconds a service's stop may run past its deadline before it is cut short


@dataclass(frozen=True)
class Health:
    """What a service says about itself: `ok` False means it is not doing its job now."""

    ok: bool
    detail: str = ""


class Service(Protocol):
    name: str

    async def start(self) -> None:
        """Begin; return once the service can be relied on (its connection open, its loop
        running). Raises if it cannot start; the services started before it are stopped."""

    async def stop(self, deadline: float) -> None:
        """End by `deadline` (time.monotonic()) and release what `start` took."""

    def health(self) -> Health: ...


class Loop(abc.ABC):
    """A service that is one background task running `loop()` until it is stopped.

    A loop that raises is logged once and reported unhealthy; it does not stop the worker.
    """

    name = "loop"
    _task: asyncio.Task[None] | None = None
    failure: BaseException | None = None

    @abc.abstractmethod
    async def loop(self) -> None:
        """The service's work, until cancelled."""

    async def start(self) -> None:
        self._task = asyncio.create_task(self._guarded(), name=f"pgqueue-{self.name}")

    async def stop(self, deadline: float) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self._task, max(deadline - time.monotonic(), 0.0))
        await self.close()

    async def close(self) -> None:
        """Release what the loop used (its connection); after the loop has ended."""
        return None

    def health(self) -> Health:
        if self.failure is not None:
            return Health(False, f"stopped by {type(self.failure).__name__}: {self.failure}")
        if self._task is None or self._task.done():
            return Health(False, "not running")
        return Health(True)

    async def every(self, interval: float, action: Callable[[], Awaitable[object]]) -> None:
        """Await `action` every `interval` seconds (± 50%, so that many workers spread out),
        forever. A failed round is logged, and the next round comes as usual."""
        while True:
            await asyncio.sleep(interval * random.uniform(0.5, 1.5))
            try:
                await action()
            except Exception as exc:
                log.error("%s failed, trying again next interval: %s", self.name, exc)

    async def _guarded(self) -> None:
        try:
            await self.loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failure = exc
            log.exception("%s stopped by an error; the worker goes on without it", self.name)


class Every(Loop):
    """A service that awaits `action` every `interval` (see Loop.every)."""

    def __init__(
        self, name: str, interval: timedelta, action: Callable[[], Awaitable[object]]
    ) -> None:
        self.name = name
        self.interval = interval.total_seconds()
        self.action = action

    async def loop(self) -> None:
        await self.every(self.interval, self.action)


class Services:
    """Services started in order and stopped in reverse."""

    def __init__(self) -> None:
        self._started: list[Service] = []

    async def start(self, service: Service) -> None:
        await service.start()
        self._started.append(service)

    async def stop(self, grace: float) -> None:
        """Stop every started service, newest first, each by a deadline `grace` seconds
        from its own stop. A stop still running a moment past its deadline (one waiting on a
        database that does not answer) is cancelled and logged, and the rest still stop."""
        while self._started:
            service = self._started.pop()
            try:
                await asyncio.wait_for(service.stop(time.monotonic() + grace), grace + STOP_SLACK)
            except asyncio.TimeoutError:
                log.error("%s did not stop within %.0f s: left as it was", service.name, grace)
            except Exception:
                log.exception("%s failed to stop cleanly", service.name)

    def __iter__(self) -> Iterator[Service]:
        """The services running now, in the order they started."""
        return iter(list(self._started))

    def health(self) -> dict[str, Health]:
        return {service.name: service.health() for service in self._started}
