"""The effects a durable call asks for, and the drivers that carry them out.

Owns: the effects a flow (pgqueue/worker/durable.py) yields: run a plan, make a step's record,
call the step's function, end the job's segment or roll it back; and the two drivers that
carry a flow's effects out on a backend (pgqueue/worker/checkpoints.py), in the handler's
thread or on the event loop, the one place the sync and async twins differ. An exception an
effect raises is thrown into the flow where it asked, so the flow sees it (a step's span).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

from pgqueue.store.plan import Plan
from pgqueue.store.steps import StepRecord
from pgqueue.worker.checkpoints import Backend

T = TypeVar("T")


class Run:
    """Run a plan on the job's connection (atomic jobs) or the worker's steps link."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Plan[Any]]) -> None:
        self.make = make


class Record(Run):
    """Make a step's record: in the job's transaction (atomic jobs, `make`), or together
    with other jobs' records (lease jobs, `record`)."""

    __slots__ = ("record",)

    def __init__(self, make: Callable[[], Plan[Any]], record: StepRecord) -> None:
        super().__init__(make)
        self.record = record


class Call:
    """Call the step's function (awaited by the async driver)."""

    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs


class End:
    """End the job's segment: commit it, and lock the job again for the next if `relock`."""

    __slots__ = ("relock",)

    def __init__(self, relock: bool) -> None:
        self.relock = relock


DISCARD = object()  # roll back the segment
Effect = Any  # Run (Record), Call, End or DISCARD
Flow = Generator[Effect, Any, T]


def drive(flow: Flow[T], backend: Backend) -> T:
    """Carry out a flow's effects in this thread (a `def` handler)."""
    try:
        effect = next(flow)
        while True:
            try:
                value = _carry_out(effect, backend)
            except BaseException as exc:  # the flow sees it where it asked (a step's span)
                effect = flow.throw(exc)
                continue
            effect = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


def _carry_out(effect: Effect, backend: Backend) -> Any:
    if isinstance(effect, Record):
        return backend.record(effect.make, effect.record)
    if isinstance(effect, Run):
        return backend.run(effect.make)
    if isinstance(effect, Call):
        return effect.fn(*effect.args, **effect.kwargs)
    if isinstance(effect, End):
        backend.end(effect.relock)
    else:
        backend.discard()
    return None


async def adrive(flow: Flow[T], backend: Backend) -> T:
    """Carry out a flow's effects on the event loop (an `async def` handler)."""
    try:
        effect = next(flow)
        while True:
            try:
                value = await _acarry_out(effect, backend)
            except BaseException as exc:
                effect = flow.throw(exc)
                continue
            effect = flow.send(value)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def _acarry_out(effect: Effect, backend: Backend) -> Any:
    if isinstance(effect, Record):
        return await backend.arecord(effect.make, effect.record)
    if isinstance(effect, Run):
        return await backend.arun(effect.make)
    if isinstance(effect, Call):
        return await effect.fn(*effect.args, **effect.kwargs)
    if isinstance(effect, End):
        await backend.aend(effect.relock)
    else:
        await backend.adiscard()
    return None
