"""pgqueue: a transactional job queue that lives entirely in PostgreSQL."""

from pgqueue.errors import (
    ConfigurationError,
    ConnectionLostError,
    DatabaseError,
    EmbeddedServerError,
    InvalidArgumentsError,
    JobNotFoundError,
    JobStateError,
    MigrationError,
    PgQueueError,
    TaskError,
    UnknownTaskError,
)
from pgqueue.models import (
    Cancellation,
    Enqueued,
    Job,
    JobOptions,
    JobPage,
    JobStatus,
    QueuePause,
    RetryPolicy,
    WorkerSettings,
)
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.registry import JobContext, NewJob, Snooze, Task
from pgqueue.tenants import ConcurrencyLimit
from pgqueue.worker import Worker

__all__ = [
    "AsyncQueue",
    "Cancellation",
    "ConcurrencyLimit",
    "ConfigurationError",
    "ConnectionLostError",
    "DatabaseError",
    "EmbeddedServerError",
    "Enqueued",
    "InvalidArgumentsError",
    "Job",
    "JobContext",
    "JobNotFoundError",
    "JobOptions",
    "JobPage",
    "JobStateError",
    "JobStatus",
    "MigrationError",
    "NewJob",
    "PgQueueError",
    "Queue",
    "QueuePause",
    "RetryPolicy",
    "Snooze",
    "Task",
    "TaskError",
    "UnknownTaskError",
    "Worker",
    "WorkerSettings",
]
