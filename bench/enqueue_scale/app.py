"""The application of the enqueue-scale suite (bench/enqueue_scale/suite.py): its workers run it."""

from __future__ import annotations

import asyncio

from pgqueue import Queue

queue = Queue()


@queue.task(name="bench.noop")
async def noop(seq: int) -> None:
    """The jobs enqueued under measurement."""


@queue.task(name="bench.hold")
async def hold(seconds: float) -> None:
    """Keeps a worker's slot busy for the whole measurement."""
    await asyncio.sleep(seconds)
