"""The exception tree. Every error pgqueue raises on purpose derives from PgQueueError.

    PgQueueError
    ├── ConfigurationError      a setting or option is impossible (names the setting and range)
    │   └── CitusUnsupportedError   a feature pgqueue does not offer on a Citus cluster
    ├── DatabaseError           the database cannot be reached, or the schema is not migrated
    │   └── ConnectionLostError the connection is closed or broke (also a psycopg
    │                           OperationalError, so retry loops that catch that still do)
    ├── TaskError
    │   ├── UnknownTaskError    no task is registered under that name
    │   ├── InvalidArgumentsError   arguments fail validation, or are not storable as JSON
    │   ├── StepMismatchError   a job's code no longer matches the steps it recorded
    │   └── StepResultError     a step returned something that is not storable as JSON
    ├── JobNotFoundError        no job has that id, live or in history
    ├── JobStateError           the job's state does not allow it (retry a succeeded job, ...)
    ├── JobFailedError          a job waited for failed (Queue.wait): its recorded error
    ├── JobCancelledError       a job waited for was cancelled
    ├── WaitTimeoutError        a wait ran out of time; the jobs run on (also a TimeoutError)
    ├── SignalTimeoutError      no signal came for a job's wait within its timeout
    ├── MigrationError          a migration failed; the transaction was rolled back
    ├── WorkerStateError        a Worker was started while it was already running
    └── EmbeddedServerError     the throwaway local PostgreSQL could not start

Messages say what was wrong, with the offending value, and what to do about it. `translate`
turns a database error into the pgqueue error it stands for, for the client's calls and its
wait hub alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg


class PgQueueError(Exception):
    """Root of every error pgqueue raises on purpose."""


class ConfigurationError(PgQueueError, ValueError):
    """A setting or option is impossible; nothing was started or stored."""


class CitusUnsupportedError(ConfigurationError):
    """What was asked is not available on a Citus cluster (see "Running on Citus" in the
    docs); raised before anything is sent."""


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


class StepMismatchError(TaskError):
    """A job's handler reached a step under another name than the one it recorded there
    (a step renamed, removed or moved since): the job fails rather than replay the wrong
    results. Finish or cancel such jobs before deploying code whose steps differ."""


class StepResultError(TaskError, ValueError):
    """A step returned a value that cannot be stored as JSON (or is over
    max_payload_bytes); nothing was recorded and the job fails."""


class SignalTimeoutError(PgQueueError, TimeoutError):
    """No signal for the key came within the wait's timeout (JobContext.wait_for_signal).
    The timeout is recorded as the step's outcome: a replay raises it again."""


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


class JobFailedError(PgQueueError):
    """A job waited for (Queue.wait) failed. Carries what its last attempt recorded: the
    exception's type (`module.qualname`, None when the worker recorded no exception, as for a
    lost worker), `error` ("Type: message"), `traceback`, and every attempt's `errors`."""

    def __init__(self, job_id: int, errors: Sequence[dict[str, Any]]) -> None:
        last = dict(errors[-1]) if errors else {}
        self.job_id = job_id
        self.errors = [dict(e) for e in errors]
        self.error_type: str | None = last.get("type")
        self.error = str(last.get("error") or "no error was recorded")
        self.traceback = str(last.get("traceback") or "")
        self.kind: str | None = last.get("kind")
        super().__init__(f"job {job_id} failed: {self.error}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.errors))


class JobCancelledError(PgQueueError):
    """A job waited for (Queue.wait) was cancelled, before it ran or while it ran."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} was cancelled")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id,))


class WaitTimeoutError(PgQueueError, TimeoutError):
    """A wait ran out of time before the jobs in `job_ids` finished. The jobs were not
    touched: they run on, and a later wait can still get their results."""

    def __init__(self, job_ids: Sequence[int], timeout: float) -> None:
        self.job_ids = list(job_ids)
        self.timeout = timeout
        shown = ", ".join(str(i) for i in self.job_ids[:10])
        more = f" and {len(self.job_ids) - 10} more" if len(self.job_ids) > 10 else ""
        super().__init__(
            f"job {shown}{more} had not finished after {timeout:g} s; "
            "it runs on: wait again, or pass a longer timeout"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_ids, self.timeout))


def translate(exc: BaseException | None, schema: str) -> None:
    """Raise the pgqueue error that a database error from one call stands for (a call of the
    client's, or the wait hub's). Serialization
    failures and deadlocks pass unchanged: callers retry those by their psycopg class."""
    if not isinstance(exc, psycopg.Error) or isinstance(exc, psycopg.errors.TransactionRollback):
        return
    missing = (
        psycopg.errors.UndefinedTable,
        psycopg.errors.UndefinedFunction,
        psycopg.errors.InvalidSchemaName,
    )
    if isinstance(exc, missing):
        option = "" if schema == "pgqueue" else f" --schema {schema}"
        raise DatabaseError(
            f"schema {schema!r} lacks pgqueue's tables or functions: run `pgqueue "
            f"migrate{option}` (or queue.migrate()) first ({exc})"
        ) from exc
    if connection_lost(exc):
        raise ConnectionLostError(f"the connection was closed or lost: {exc}".strip()) from exc
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        raise DatabaseError(
            f"{exc.diag.message_primary or exc}: this role lacks a grant this call needs; "
            "`pgqueue grant ROLE --kind worker|app|read|operator` grants what each needs"
        ) from exc
    if isinstance(exc, psycopg.errors.InFailedSqlTransaction):
        raise DatabaseError(
            "the transaction was aborted by an earlier error: roll it back first"
        ) from exc
    raise DatabaseError(f"{type(exc).__name__}: {exc}".strip()) from exc


def connection_lost(exc: psycopg.Error) -> bool:
    """A closed or broken connection: psycopg's own (no SQLSTATE), a connection exception
    (class 08) or the server shutting the session down (57P01-57P03)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")
