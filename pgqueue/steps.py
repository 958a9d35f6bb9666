"""Durable calls as a handler's JobContext sees them: the `Steps` a worker gives each attempt
(pgqueue/worker/durable.py implements it), and the rules of their names, which a handler and an
application's `Queue.signal` both check.

Owns: the protocol JobContext is typed against, so the domain names no worker module; how long a
step's (sleep's, wait's) name and a signal's key may be, and the check that refuses one that is
not a non-empty string of at most that many characters. Unlike a task's or a queue's name
(models.check_identifier), these are free text: any characters but NUL.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from pgqueue.errors import ConfigurationError

KEY_MAX = 1000  # characters of a signal's key
NAME_MAX = 200  # characters of a step's name


def check_label(kind: str, name: str, longest: int = NAME_MAX) -> str:
    """A step's name or a signal's key: a non-empty string of at most `longest` characters,
    without NUL; ConfigurationError naming `kind` otherwise."""
    if not isinstance(name, str) or not name or len(name) > longest or "\x00" in name:
        raise ConfigurationError(
            f"a {kind} is a non-empty string of at most {longest} characters, got {name!r}"
        )
    return name


class Steps(Protocol):
    """One attempt's durable calls, as JobContext forwards them (its methods say what each
    guarantees). `name`, `key` and durations arrive unchecked: the implementation checks
    them (check_label) and raises ConfigurationError for a bad one."""

    def step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...

    async def astep(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any: ...

    def sleep(self, length: timedelta | float, name: str) -> None: ...

    async def asleep(self, length: timedelta | float, name: str) -> None: ...

    def sleep_until(self, when: datetime, name: str) -> None: ...

    async def asleep_until(self, when: datetime, name: str) -> None: ...

    def wait_for_signal(
        self, key: str, timeout: timedelta | float | None, name: str | None
    ) -> Any: ...

    async def await_for_signal(
        self, key: str, timeout: timedelta | float | None, name: str | None
    ) -> Any: ...
