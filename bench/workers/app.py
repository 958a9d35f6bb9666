"""The application the many-workers suite (bench/workers/suite.py) runs in each worker process:
a no-op task, and a recurring job every second, which every worker's scheduler could enqueue
and only one may."""

from __future__ import annotations

from pgqueue import Queue

queue = Queue()


@queue.task(name="bench.noop")
def noop() -> None:
    """The jobs the suite inserts in SQL."""


@queue.periodic(every=1.0, name="bench.tick")
@queue.task(name="bench.tick")
def tick() -> None:
    """Enqueued once a second across all the workers."""
