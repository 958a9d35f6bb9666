"""The threads `def` handlers run in, and the way their results come back to the event loop.

Owns: at most `size` threads, each started when a call finds none idle, each running calls
until the pool shuts down; and, per event loop, the hand-off of each call's result (or
exception) to the asyncio future the executor awaits.

Invariants:
- A submitted call runs once, in one of the pool's threads; after shutdown, calls not yet
  started never start, and those running run on to their end with nothing waiting for them.
- Results come back with one wake-up of the event loop for all that arrive together, where
  run_in_executor wakes it once per call, which dominated a short `def` handler's cost.
- A handler raising StopIteration, which an asyncio future refuses, reaches its future as a
  RuntimeError: through run_in_executor such a job waited forever.

Lighter than concurrent.futures.ThreadPoolExecutor, whose submit builds a Future with its
own lock and condition for every call, which the hand-off never reads. Its threads are as
that pool's: named `{name}_{n}`, not daemons, so an interpreter exiting waits for a handler
still running (the CLI leaves at once instead, pgqueue/cli/commands.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any


class Threads:
    """At most `size` threads named after `name`, started as calls need them."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0  # threads waiting for a call that no submitted call counts on yet
        self._shut = False

    def submit(self, call: Callable[[], None]) -> None:
        """Run `call` in a thread of the pool; it must not raise."""
        with self._lock:
            if self._shut:
                raise RuntimeError("the handlers' threads are shut down")
            if self._idle:
                self._idle -= 1
            elif self._started < self.size:
                name = f"{self.name}_{self._started}"
                threading.Thread(target=self._serve, name=name).start()
                self._started += 1
        self._calls.put(call)

    def shutdown(self) -> None:
        """Drop the calls not started; each thread ends after the call it is running."""
        with self._lock:
            self._shut = True
            started = self._started
        with contextlib.suppress(queue.Empty):
            while True:
                self._calls.get_nowait()
        for _ in range(started):
            self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
            with self._lock:
                self._idle += 1


class Handoff:
    """Calls run in `threads`, their results delivered to futures of `loop`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: Threads) -> None:
        self.loop = loop
        self.threads = threads
        self._lock = threading.Lock()
        self._done: list[tuple[asyncio.Future[Any], bool, Any]] = []
        self._woken = False

    def run(self, call: Callable[[], Any]) -> asyncio.Future[Any]:
        """On the loop: a future that gets `call`'s result or exception."""
        future: asyncio.Future[Any] = self.loop.create_future()
        self.threads.submit(lambda: self._work(future, call))
        return future

    def _work(self, future: asyncio.Future[Any], call: Callable[[], Any]) -> None:
        """In a pool thread: run the call, queue its result, wake the loop if nobody has."""
        try:
            done = (future, True, call())
        except StopIteration as exc:
            refused = RuntimeError(f"the handler raised StopIteration: {exc}")
            refused.__cause__ = exc  # its traceback stays in the job's error record
            done = (future, False, refused)
        except BaseException as exc:  # the handler's to report, whatever it is
            done = (future, False, exc)
        with self._lock:
            self._done.append(done)
            wake, self._woken = not self._woken, True
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
                self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        """On the loop: hand every queued result to its future (a timed-out one is gone)."""
        with self._lock:
            done, self._done, self._woken = self._done, [], False
        for future, ok, value in done:
            if future.cancelled():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
