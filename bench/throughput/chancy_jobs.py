"""Chancy's no-op job: Chancy's worker imports a job by its module path, so it lives at the
top level of a module of its own (imported only where Chancy is installed)."""

from __future__ import annotations

from chancy import job

from bench.throughput.systems import RECORDER


@job(queue="default")
async def noop(*, seq: int) -> None:
    RECORDER.record(seq)
