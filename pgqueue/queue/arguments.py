"""The checks of the client's arguments that are not a pydantic model's: job and message ids,
task and queue names, rate limits, an atomic task's timeout, a workflow found or not.

Each returns the value as the store takes it, or raises the pgqueue error that names the value
and says what to do (ConfigurationError, InvalidArgumentsError, JobNotFoundError).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from pgqueue.errors import (
    ConfigurationError,
    InvalidArgumentsError,
    JobNotFoundError,
)
from pgqueue.models import (
    ATOMIC_DEFAULT_TIMEOUT,
    ATOMIC_MAX_TIMEOUT,
    QUEUE_NAME,
    TASK_NAME,
    Message,
    NewJob,
    Workflow,
    check_identifier,
    duration,
)
from pgqueue.registry import Task


def _atomic_timeout(timeout: timedelta | None) -> timedelta:
    """An atomic job holds a transaction for its whole run, which holds back VACUUM: its
    time is always bounded."""
    if timeout is None:
        return ATOMIC_DEFAULT_TIMEOUT
    if timeout > ATOMIC_MAX_TIMEOUT:
        raise ConfigurationError(
            f"atomic tasks hold a transaction open for their whole run; timeout={timeout} is "
            f"over the {ATOMIC_MAX_TIMEOUT} limit: use a lease (non-atomic) task instead"
        )
    return timeout


def _message_id(value: object) -> int:
    """An outbox id as stage returns it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise ConfigurationError(
            f"message ids are whole numbers from 1 to 2**63-1 (as stage returns them), got "
            f"{value!r}"
        )
    return value


def _message(
    destination: str,
    message: Any,
    key: str | None,
    headers: dict[str, str] | None,
    message_id: str | None,
) -> Message:
    """stage()'s arguments as a Message, or an InvalidArgumentsError that says what is wrong."""
    try:
        return Message(
            destination=destination,
            message=message,
            key=key,
            headers=headers,
            message_id=message_id,
        )
    except ValidationError as exc:
        raise InvalidArgumentsError(f"a message for {destination!r}: {exc}") from None


def _task_name(task: str | Task[..., Any]) -> str:
    """A task's name, from the task or as a string checked as task names are."""
    if isinstance(task, Task):
        return task.name
    if not isinstance(task, str):
        raise ConfigurationError(f"name a task, or pass the task itself; got {task!r}")
    return check_identifier("task", task, TASK_NAME)


def _queue_names(queues: str | Sequence[str]) -> list[str]:
    """One queue name or several, each checked as an enqueue checks it."""
    names = [queues] if isinstance(queues, str) else list(queues)
    if not names:
        raise ConfigurationError("name at least one queue")
    return list(dict.fromkeys(check_identifier("queue", name, QUEUE_NAME) for name in names))


_RATE_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_RATE_STARTS = 10_000


def _rate(limit: int | str, per: timedelta | float | None) -> tuple[int, float]:
    """(max_starts, seconds) from `100, per=60` or "100/m" ("N/s", "N/m", "N/h")."""
    if isinstance(limit, str):
        count, _, unit = limit.strip().partition("/")
        if per is not None or unit not in _RATE_UNITS or not count.strip().isdigit():
            raise ConfigurationError(
                f"a rate limit is 'N/s', 'N/m' or 'N/h', or N with per= seconds; got {limit!r}"
            )
        limit, seconds = int(count), float(_RATE_UNITS[unit])
    else:
        window = duration(per, "per")
        if window is None:
            raise ConfigurationError("give the window: set_rate_limit(queue, 100, per=60)")
        seconds = window.total_seconds()
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_RATE_STARTS:
        raise ConfigurationError(
            f"a rate limit lets 1 to {MAX_RATE_STARTS:,} jobs start, got {limit!r}"
        )
    if not 0 < seconds <= 86400:
        raise ConfigurationError(
            f"a rate limit's window is over 0 s and at most a day, got {seconds} s"
        )
    return limit, seconds


def _jobs_only(jobs: Iterable[NewJob]) -> list[NewJob]:
    batch = list(jobs)
    for item in batch:
        if not isinstance(item, NewJob):
            raise TypeError(
                f"enqueue_many takes jobs built with task.job(...), got {type(item).__name__}"
            )
    return batch


def _workflow_jobs(found: Workflow | None, workflow_id: int) -> list[int]:
    if found is None:
        raise JobNotFoundError(f"no job belongs to a workflow with id {workflow_id}")
    return [job.id for job in found.jobs]


def _workflow_jobs_ended(found: Workflow | None, workflow_id: int) -> Workflow:
    if found is None:  # its history was pruned between the wait and the read
        raise JobNotFoundError(
            f"the jobs of workflow {workflow_id} finished, but their records are gone "
            "(keep_history=False, or pruned by retention)"
        )
    return found
