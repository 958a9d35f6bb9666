"""What a worker tells its operator as it starts, about jobs that would otherwise wait
without a word: the tasks it will never run, and the served queues that are paused."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pgqueue.models import ALL_QUEUES
from pgqueue.registry import Registry
from pgqueue.runtime.link import Link
from pgqueue.store.plan import run_async
from pgqueue.store.queues import paused_plan

log = logging.getLogger("pgqueue.worker")


def warn_unserved(registry: Registry, queues: Sequence[str]) -> None:
    """Say which of the application's tasks (those its fallback finds too) run on none of
    `queues`: a task on a queue no worker serves waits forever otherwise."""
    served = set(queues)
    for name, queue in sorted(registry.queue_of_each_task().items()):
        if queue not in served:
            log.warning(
                "task %r runs on queue %r, which this worker does not serve: its jobs wait "
                "for a worker started with --queues %s (or --queues all)",
                name,
                queue,
                queue,
            )


async def warn_paused(link: Link, schema: str, queues: Sequence[str]) -> None:
    """Say which of `queues` are paused: their jobs wait until resumed."""
    paused = await link.run(lambda conn: run_async(conn, paused_plan(schema)))
    served = set(queues)
    for pause in paused:
        if pause.queue in served or ALL_QUEUES in served:
            log.warning(
                "queue %r is paused (since %s%s): its jobs wait for `pgqueue queues resume %s`",
                pause.queue,
                pause.paused_at.isoformat(timespec="seconds"),
                f", {pause.reason}" if pause.reason else "",
                pause.queue,
            )
