"""How the Citus bench's phases enqueue: PRODUCERS threads, each with its index, on the queue
of the system measured (a plain Queue or a CitusQueue)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pgqueue import Queue
from pgqueue.citus import CitusQueue

PRODUCERS = 4


def queue_for(system: str, dsn: str, schema: str) -> Queue:
    """The queue a phase of `system` enqueues on (close it)."""
    return Queue(dsn, schema=schema) if system == "single" else CitusQueue(dsn, schema=schema)


def in_threads(produce: Callable[[int], None]) -> None:
    """`produce(index)` for each of PRODUCERS threads at once, until all have ended."""
    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
