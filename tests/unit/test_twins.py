"""Queue and AsyncQueue are twins: the same public names, with the same parameters and the
same docstrings."""

from __future__ import annotations

import inspect

from pgqueue import AsyncQueue, Queue


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_the_twins_expose_the_same_names() -> None:
    assert _public(Queue) == _public(AsyncQueue)


def test_the_twins_methods_take_the_same_parameters() -> None:
    for name in sorted(_public(Queue)):
        sync, twin = getattr(Queue, name), getattr(AsyncQueue, name)
        if not callable(sync):
            continue
        shape = [(p.name, p.kind, p.default) for p in inspect.signature(sync).parameters.values()]
        other = [(p.name, p.kind, p.default) for p in inspect.signature(twin).parameters.values()]
        assert shape == other, name


def test_the_twins_methods_are_documented_once_and_read_the_same() -> None:
    for name in sorted(_public(Queue)):
        written = inspect.getdoc(getattr(Queue, name))
        assert written, f"Queue.{name} has no docstring"
        assert inspect.getdoc(getattr(AsyncQueue, name)) == written, name
