"""Tasks with only int/str/float/bool parameters skip pydantic: the fast path must
give exactly what the validated path gives, or hand over to it for the same error."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pgqueue import JobContext, Queue
from pgqueue.errors import InvalidArgumentsError
from pgqueue.models import NewJob
from pgqueue.registry import Task

queue = Queue()


@queue.task(name="plain.mixed")
def mixed(a: int, b: str, /, c: float = 1.5, *, d: bool = False) -> None: ...


@queue.task(name="plain.ctx")
def with_ctx(n: int, ctx: JobContext, label: str = "x") -> None: ...


@queue.task(name="plain.not_plain")
def not_plain(items: list[int]) -> None: ...


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1, "x"), {}),
    ((1, "x", 2.5), {"d": True}),
    ((1, "x"), {"c": 3.0}),
    ((True, "x"), {}),  # bool for int: pydantic decides
    (("1", "x"), {}),  # str for int: pydantic coerces
    ((1, "x", 2), {}),  # int for float: pydantic converts
    ((1, "x", float("nan")), {}),
    ((1, "nul\x00"), {}),
    ((1, "lone \ud800"), {}),
    ((1,), {}),  # missing
    ((1, "x", 1.0, True), {}),  # d is keyword-only
    ((1, "x"), {"a": 2}),  # a is positional-only
    ((1, "x"), {"zzz": 1}),
    ((1, "x", 1.0), {"c": 2.0}),
    # every parameter by position: the one-pass branch
    ((1, "x", 2.5), {}),
    ((1, "nul\x00", 2.5), {}),
    ((1, "x", float("inf")), {}),
    ((1, "x", True), {}),  # bool for float
]


def slow(task: Task[..., Any]) -> Task[..., Any]:
    clone = Task(task.fn, name=task.name, options=task.options, policy=task.policy)
    clone._plain = None
    return clone


def outcome(call: Any) -> Any:
    """The result or the error message; repr() so that 2 and 2.0 differ."""
    try:
        return ("ok", repr(call()))
    except InvalidArgumentsError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_plain_dump_matches_the_validated_path(args: tuple[Any, ...], kwargs: Any) -> None:
    assert mixed._plain is not None
    fast = outcome(lambda: mixed.dump_args(args, kwargs))
    assert fast == outcome(lambda: slow(mixed).dump_args(args, kwargs))


STORED: list[dict[str, Any]] = [
    {"a": 1, "b": "x"},
    {"a": 1, "b": "x", "c": 2.0, "d": True},
    {"a": 1, "b": "x", "c": 2},
    {"a": "1", "b": "x"},
    {"a": 1},
    {"a": 1, "b": "x", "extra": 1},
]


@pytest.mark.parametrize("stored", STORED)
def test_plain_load_matches_the_validated_path(stored: dict[str, Any]) -> None:
    context = JobContext(1, "plain.mixed", "default", 1, 25)
    fast = outcome(lambda: mixed.load_args(stored, context))
    assert fast == outcome(lambda: slow(mixed).load_args(stored, context))


def test_context_parameter_still_receives_the_context_on_the_fast_path() -> None:
    assert with_ctx._plain is not None
    context = JobContext(7, "plain.ctx", "default", 1, 25)
    assert with_ctx.load_args({"n": 3}, context) == ([], {"n": 3, "ctx": context})
    assert with_ctx.dump_args((3,), {}) == {"n": 3}


def test_other_annotations_keep_the_validated_path() -> None:
    assert not_plain._plain is None
    assert not_plain.dump_args(([1, 2],), {}) == {"items": [1, 2]}
    assert dataclasses.is_dataclass(JobContext)


def test_every_parameter_by_position_takes_the_fast_path() -> None:
    assert mixed._plain is not None
    assert mixed._plain.dump((1, "x", 2.5), {}) == {"a": 1, "b": "x", "c": 2.5}
    assert mixed._plain.dump((1, "x", 2), {}) is None  # an int for a float: pydantic's


def test_a_built_job_is_the_frozen_dataclass_its_fields_make() -> None:
    job = mixed.job(1, "x")
    assert job == NewJob("plain.mixed", {"a": 1, "b": "x"}, mixed.options, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.args = {}  # type: ignore[misc]
