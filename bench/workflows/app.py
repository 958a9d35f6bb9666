"""The application the workflows and rates suites (bench/workflows/suite.py,
bench/rates/suite.py) run in worker processes."""

from __future__ import annotations

from pgqueue import Queue

queue = Queue()


@queue.task(name="bench.member")
def member(i: int) -> int:
    return i


@queue.task(name="bench.collect")
def collect(values: list[int]) -> int:
    return len(values)


@queue.task(name="noop")
def noop() -> None:
    """The jobs the benches insert in SQL."""


@queue.task(name="bench.free")
def free() -> None:
    """The unlimited jobs beside a limited task's (bench/rates/suite.py)."""
