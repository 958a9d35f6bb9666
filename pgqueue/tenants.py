"""Per-key concurrency limits (tenants): what a limit is, which keys and limits are valid,
and the keys a job gets from its task's templates.

A key's limit is its max_running; '*' is the default for keys without a row of their own,
and no '*' row means such keys are unlimited. A job's keys are its concurrency_key and its
limits together. A task may declare limits as templates ("tenant:{tenant_id}"), formatted
from each job's arguments when the job is built. pgqueue/store/concurrency.py stores limits
and runs the worker's sweep. Fails with ConfigurationError on a bad key, limit or template
(at declaration), InvalidArgumentsError when a job's arguments cannot fill a template.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict

from pgqueue.errors import ConfigurationError, InvalidArgumentsError
from pgqueue.models import CONCURRENCY_KEY, JobOptions

DEFAULT_KEY = "*"


class ConcurrencyLimit(BaseModel):
    """One key as `Queue.concurrency_limits()` lists it. key '*' is the default limit;
    max_running None: no row of its own (the default applies)."""

    model_config = ConfigDict(frozen=True)

    key: str
    max_running: int | None
    running: int
    waiting: int


class FairShare(BaseModel):
    """One fairness key of one queue as `Queue.fair_shares()` lists it: its weight, its
    queued and running jobs, the fair jobs it started over the window, the share of the
    queue's fair starts that is (None: no starts), and the share its weight owes it among the
    keys listed for the queue (those with jobs, or starts in the window)."""

    model_config = ConfigDict(frozen=True)

    queue: str
    key: str
    weight: float
    queued: int
    running: int
    started: int
    share: float | None
    owed: float


def refuse_keyed_atomic(task: str, key: str | Iterable[str]) -> None:
    given = f"concurrency_key={key!r}" if isinstance(key, str) else f"limits={list(key)!r}"
    raise ConfigurationError(
        f"task {task!r} is atomic and cannot take {given}: an atomic job holds "
        "a transaction, not a slot; use a lease (non-atomic) task for per-key limits"
    )


def check_keyed_atomic(task: str, options: JobOptions) -> None:
    """Refuses an atomic job any limit or fairness key (ConfigurationError)."""
    if options.concurrency_key is not None:
        refuse_keyed_atomic(task, options.concurrency_key)
    if options.limits is not None:
        refuse_keyed_atomic(task, options.limits)
    if options.fairness_key is not None:
        raise ConfigurationError(
            f"task {task!r} is atomic and cannot take fairness_key={options.fairness_key!r}: "
            "atomic jobs are claimed in their own transactions, first in, first out; use a "
            "lease (non-atomic) task for fair shares"
        )


def template_fields(template: str) -> list[str]:
    """The argument names a key template formats ("tenant:{tenant_id}" -> ["tenant_id"]);
    ConfigurationError for a template str.format cannot read."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigurationError(
            f"key template {template!r} cannot be read ({e}); write a literal brace as {{{{ or }}}}"
        ) from None
    names = []
    for _, field, _, _ in parsed:
        if field is not None:
            name = field.split(".", 1)[0].split("[", 1)[0]
            if not name or name.isdigit():
                raise ConfigurationError(
                    f"key template {template!r}: name the argument, as in "
                    "'tenant:{tenant_id}' (positional fields like {} or {0} have no value)"
                )
            names.append(name)
    return names


def check_templates(task: str, keys: Iterable[str], params: Iterable[str] | None) -> None:
    """At declaration: every template names a parameter of the handler (when it is known)."""
    known = None if params is None else set(params)
    for key in keys:
        for name in template_fields(key):
            if known is not None and name not in known:
                raise ConfigurationError(
                    f"task {task!r}: key template {key!r} names {name!r}, which is not "
                    f"a parameter of the handler (it has {sorted(known)})"
                )


def templated(options: JobOptions) -> list[str]:
    """The task's keys that may be templates: its limits and its fairness key."""
    keys = list(options.limits or ())
    if options.fairness_key is not None:
        keys.append(options.fairness_key)
    return keys


def resolve_keys(task: str, options: JobOptions, args: dict[str, Any]) -> JobOptions:
    """The options with their limit and fairness key templates formatted from the job's
    arguments (as JSON); the options themselves when no key is a template.
    InvalidArgumentsError names the template and the missing argument, or the key it made
    when that key is not valid."""
    if not any("{" in k or "}" in k for k in templated(options)):
        return options
    update: dict[str, Any] = {}
    if options.limits is not None:
        keys = [_format(task, template, args) for template in options.limits]
        update["limits"] = tuple(dict.fromkeys(keys))
    if options.fairness_key is not None:
        update["fairness_key"] = _format(task, options.fairness_key, args)
    return options.model_copy(update=update)


def _format(task: str, template: str, args: dict[str, Any]) -> str:
    if "{" not in template and "}" not in template:
        return template
    try:
        key = template.format_map(args)
    except (KeyError, IndexError, AttributeError) as e:
        raise InvalidArgumentsError(
            f"task {task!r}: key template {template!r} needs the argument {e}, which this "
            f"job does not have (its arguments: {sorted(args)}); pass it, or give the key "
            "at enqueue"
        ) from None
    if not CONCURRENCY_KEY.fullmatch(key):
        raise InvalidArgumentsError(
            f"task {task!r}: key template {template!r} made {key[:300]!r}, not a valid key "
            "(1-255 characters without NUL, not '*')"
        )
    return key


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
