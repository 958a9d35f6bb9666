"""pgqueue's check of a django.tasks call's arguments, beside Django's JSON check: they fit
the function's parameters, and its annotated ones take these JSON values, at enqueue rather
than when the job runs (pgqueue/contrib/django/tasks.py calls it)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from typing import Any

from django.tasks import Task as DjangoTask
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from pgqueue.errors import InvalidArgumentsError


@dataclasses.dataclass(frozen=True)
class _Parameters:
    """A task function's parameters as enqueue checks them (made once per function)."""

    signature: inspect.Signature  # without the context parameter
    variadic: frozenset[str]  # *args and **kwargs: Django's JSON check is all they get
    model: type[BaseModel] | None  # the annotated ones, None when none is


_parameters: dict[Any, _Parameters] = {}


def check_annotations(task: DjangoTask, args: list[Any], kwargs: dict[str, Any]) -> None:
    """pgqueue's check beside Django's: the arguments fit the function's parameters, and
    its annotated ones take these JSON values, at enqueue rather than when the job runs."""
    found = _parameters.get(task.func)
    if found is None:
        found = _parameters.setdefault(task.func, _read_parameters(task))
    try:
        bound = found.signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentsError(f"task {task.module_path!r}: {exc}") from None
    if found.model is None:
        return
    values = {k: v for k, v in bound.arguments.items() if k not in found.variadic}
    try:
        found.model.model_validate_json(json.dumps(values), strict=True)
    except ValidationError as exc:
        raise InvalidArgumentsError(
            f"task {task.module_path!r}: invalid arguments: {exc}"
        ) from None


def _read_parameters(task: DjangoTask) -> _Parameters:
    signature = inspect.signature(task.func)
    params = list(signature.parameters.values())[1 if task.takes_context else 0 :]
    try:
        hints = typing.get_type_hints(task.func)
    except Exception:  # an annotation that does not resolve checks nothing
        hints = {}
    variadic = frozenset(p.name for p in params if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
        for p in params
        if p.name not in variadic
    }
    model = None
    if any(p.name in hints for p in params):
        model = create_model(
            f"{task.module_path}:args",
            __config__=ConfigDict(arbitrary_types_allowed=True),
            **fields,
        )
    return _Parameters(signature.replace(parameters=params), variadic, model)
