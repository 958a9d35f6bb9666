"""Per-key concurrency limits (tenants): what a limit is, and which keys and limits are valid.

A key's limit is its max_running; '*' is the default for keys without a row of their own,
and no '*' row means such keys are unlimited. pgqueue/store/concurrency.py stores them and
runs the worker's sweep. Fails with ConfigurationError on a bad key or limit.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from pgqueue.errors import ConfigurationError
from pgqueue.models import CONCURRENCY_KEY

DEFAULT_KEY = "*"


class ConcurrencyLimit(BaseModel):
    """One key as `Queue.concurrency_limits()` lists it. key '*' is the default limit;
    max_running None: no row of its own (the default applies)."""

    model_config = ConfigDict(frozen=True)

    key: str
    max_running: int | None
    running: int
    waiting: int


def refuse_keyed_atomic(task: str, key: str) -> None:
    raise ConfigurationError(
        f"task {task!r} is atomic and cannot take concurrency_key={key!r}: an atomic job holds "
        "a transaction, not a slot; use a lease (non-atomic) task for per-key limits"
    )


def limit_key(key: str | None) -> str:
    """The key as stored: '*' for None (the default); refuses a key no job could carry."""
    if key is None:
        return DEFAULT_KEY
    if not isinstance(key, str) or not CONCURRENCY_KEY.fullmatch(key):
        raise ConfigurationError(
            f"invalid concurrency key {key!r}: 1-255 characters without NUL; pass key=None "
            "(or --default) for the default limit"
        )
    return key


def limit_value(key: str, max_running: int) -> int:
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 0:
        raise ConfigurationError(
            f"max_running={max_running!r} for key {key!r}: give a whole number, 0 or more "
            "(0 pauses the key)"
        )
    return max_running
