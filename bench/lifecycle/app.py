"""The application the lifecycle suite's worker process runs: one no-op task. The suite
enqueues its jobs through a Queue of its own with the same task name and schema."""

from __future__ import annotations

from pgqueue import Queue

TASK = "bench.lifecycle.noop"

queue = Queue()


@queue.task(name=TASK)
def noop(seq: int) -> None:
    """Does nothing: the suite counts what the job's lifecycle costs, not its work."""
