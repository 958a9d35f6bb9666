"""The producer side: enqueue and read jobs with `Queue` (sync) and `AsyncQueue`, twins with the
same method names.

Owns: the task decorator and registry of one application, and the statements an application
runs. Every call takes an optional psycopg connection; given one, it runs inside whatever
transaction the caller has open and never commits or rolls back, so the job becomes visible to
workers exactly when the caller's data does, and vanishes with it on rollback. Without one,
the queue uses its own pooled connection and commits.

Nothing here imports pgqueue.worker: an application that only enqueues loads none of the
worker (a unit test parses these files to keep it so). base.py holds what the twins share,
sync.py and aio.py the twins, arguments.py and connections.py the checks of what a caller
passes, outcomes.py what a finished job means to a waiter, waiting.py the hub that hears jobs
finish.
"""

from pgqueue.queue.aio import AsyncQueue
from pgqueue.queue.sync import Queue

__all__ = ["AsyncQueue", "Queue"]
