"""The application the lifecycle suite's worker process runs: one no-op task, and its
`async def` twin for bench/lifecycle/worker_cost.py. The suite enqueues its jobs through a
Queue of its own with the same task name and schema."""

from __future__ import annotations

from pgqueue import Queue

TASK = "bench.lifecycle.noop"
ASYNC_TASK = "bench.lifecycle.noop_async"

queue = Queue()


@queue.task(name=TASK)
def noop(seq: int) -> None:
    """Does nothing: the suite counts what the job's lifecycle costs, not its work."""


@queue.task(name=ASYNC_TASK)
async def noop_async(seq: int) -> None:
    """Does nothing, on the event loop: a worker's cost with no thread pool."""
