"""The exception tree. Every error pgqueue raises on purpose derives from PgQueueError.

    PgQueueError
    ├── ConfigurationError      a setting or option is impossible (names the setting and range)
    ├── DatabaseError           the database cannot be reached, or the schema is not migrated
    │   └── ConnectionLostError the connection is closed or broke (also a psycopg
    │                           OperationalError, so retry loops that catch that still do)
    ├── TaskError
    │   ├── UnknownTaskError    no task is registered under that name
    │   └── InvalidArgumentsError   arguments fail validation, or are not storable as JSON
    ├── JobNotFoundError        no job has that id, live or in history
    ├── JobStateError           the job's state does not allow it (retry a succeeded job, ...)
    ├── MigrationError          a migration failed; the transaction was rolled back
    ├── WorkerStateError        a Worker was started while it was already running
    └── EmbeddedServerError     the throwaway local PostgreSQL could not start

Messages say what was wrong, with the offending value, and what to do about it.
"""

from __future__ import annotations

import psycopg


class PgQueueError(Exception):
    """Root of every error pgqueue raises on purpose."""


class ConfigurationError(PgQueueError, ValueError):
    """A setting or option is impossible; nothing was started or stored."""


class DatabaseError(PgQueueError):
    """The database cannot be reached, or it lacks the pgqueue schema."""


class ConnectionLostError(DatabaseError, psycopg.OperationalError):
    """The connection was closed, or broke (the server restarted or ended the session). It
    is a psycopg OperationalError too: code that retries on those keeps retrying."""


class TaskError(PgQueueError):
    """A problem with a task or its arguments; nothing was stored."""


class UnknownTaskError(TaskError, LookupError):
    """No task is registered under the given name."""


class InvalidArgumentsError(TaskError, ValueError):
    """Arguments fail validation against the task's signature or cannot be stored as JSON."""


class MigrationError(PgQueueError):
    """A migration failed; its transaction was rolled back and nothing was applied."""


class EmbeddedServerError(PgQueueError):
    """The embedded PostgreSQL could not be started."""


class JobNotFoundError(PgQueueError, LookupError):
    """No job has the given id, in the hot table or in history."""


class JobStateError(PgQueueError):
    """The job's state does not allow the operation; nothing was changed."""


class WorkerStateError(PgQueueError, RuntimeError):
    """A Worker was started while it was already running; the running worker goes on."""
