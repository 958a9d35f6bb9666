"""pgqueue: a transactional job queue that lives entirely in PostgreSQL."""

from pgqueue.errors import (
    ConfigurationError,
    DatabaseError,
    EmbeddedServerError,
    InvalidArgumentsError,
    MigrationError,
    PgQueueError,
    TaskError,
    UnknownTaskError,
)
from pgqueue.models import Job, JobOptions, JobStatus, RetryPolicy, WorkerSettings
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.registry import JobContext, NewJob, Task
from pgqueue.tenants import ConcurrencyLimit
from pgqueue.worker import Worker

__all__ = [
    "AsyncQueue",
    "ConcurrencyLimit",
    "ConfigurationError",
    "DatabaseError",
    "EmbeddedServerError",
    "InvalidArgumentsError",
    "Job",
    "JobContext",
    "JobOptions",
    "JobStatus",
    "MigrationError",
    "NewJob",
    "PgQueueError",
    "Queue",
    "RetryPolicy",
    "Task",
    "TaskError",
    "UnknownTaskError",
    "Worker",
    "WorkerSettings",
]
