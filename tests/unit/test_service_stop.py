"""A worker's services stop newest first, each by its deadline (pgqueue/runtime/service.py):
one whose stop never returns is cut short and the rest still stop, so SIGTERM always ends
the process."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from pgqueue.runtime.service import STOP_SLACK, Health, Services


class Recorded:
    """A service that notes its stop; `hangs` makes that stop wait forever, as one waiting on
    a database that never answers would."""

    def __init__(self, name: str, stopped: list[str], *, hangs: bool = False) -> None:
        self.name = name
        self.stopped = stopped
        self.hangs = hangs

    async def start(self) -> None:
        return None

    async def stop(self, deadline: float) -> None:
        if self.hangs:
            await asyncio.Event().wait()
        self.stopped.append(self.name)

    def health(self) -> Health:
        return Health(True)


def test_a_stop_that_never_returns_is_cut_short_and_the_rest_still_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    async def run() -> float:
        services = Services()
        await services.start(Recorded("first", stopped))
        await services.start(Recorded("stuck", stopped, hangs=True))
        await services.start(Recorded("last", stopped))
        began = time.monotonic()
        await services.stop(0.2)
        return time.monotonic() - began

    with caplog.at_level(logging.ERROR, logger="pgqueue.worker"):
        # Without the cut, the stop waits forever: the test fails after 10 s instead.
        took = asyncio.run(asyncio.wait_for(run(), 10))
    assert stopped == ["last", "first"]
    assert took < 0.2 + STOP_SLACK + 1.0
    assert "stuck did not stop within" in caplog.text
