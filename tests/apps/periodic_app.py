"""An application with one recurring job, for tests that run real worker processes
(`python -m pgqueue worker tests.apps.periodic_app:queue`). Kept apart from tests.apps.tasks so the
workers of other tests never schedule it. Each run is recorded like tests.apps.tasks records."""

from __future__ import annotations

from datetime import timedelta

from pgqueue import JobContext, Queue
from tests.apps.tasks import _record

queue = Queue()


@queue.periodic(every=timedelta(seconds=1))
@queue.task(name="heartbeat_tick")
def heartbeat_tick(ctx: JobContext) -> None:
    _record(f"{ctx.job_id} tick")
