"""oban-py's no-op worker: Oban runs a job by importing its worker class from the module path
stored with the job, so it lives at the top level of a module of its own (imported only where
oban-py is installed)."""

from __future__ import annotations

from typing import Any

from oban import worker

from bench.throughput.systems import RECORDER


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        RECORDER.record(job.args["seq"])
