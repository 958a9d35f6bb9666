"""The jobs a Citus worker runs, by shard, and their outcomes still to write.

Owns: each running job's task and shard, the outcomes not yet written, and the put-back of
unfinished jobs at stop. Every write names its shard, so it runs on that shard's node; the
shards of one node are written in one transaction there (one commit for the node's share of
the outcomes, never a two-phase one). A group whose write failed keeps its outcomes for the
next call (the statements' guard makes a second write of one that did commit move nothing).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from functools import partial

from pgqueue.citus.routes import Route
from pgqueue.models import ClaimedJob
from pgqueue.queries import Tables
from pgqueue.store import citus as store
from pgqueue.store.plan import AsyncConn
from pgqueue.worker.executor import Executor
from pgqueue.worker.outcome import Outcome

log = logging.getLogger("pgqueue.citus")


class InFlight:
    """What one run of a Citus worker has claimed and not yet written."""

    def __init__(
        self, executor: Executor, schema: str, keep_history: bool, wake: Callable[[], None]
    ) -> None:
        self.executor = executor
        self.schema = schema
        self.keep_history = keep_history
        self.wake = wake  # an outcome is ready to write
        self.running: dict[int, tuple[asyncio.Future[Outcome], ClaimedJob, str]] = {}
        self.done: list[tuple[str, Outcome]] = []
        self.finished = 0  # outcomes written

    def held(self) -> list[int]:
        """The ids of the jobs this worker holds: running, or ended and not yet written."""
        return [*self.running, *(outcome.job.id for _, outcome in self.done)]

    def start(self, job: ClaimedJob, shard: str) -> None:
        task = asyncio.ensure_future(self.executor.run(job))
        self.running[job.id] = (task, job, shard)
        task.add_done_callback(partial(self._ended, job.id))

    def _ended(self, job_id: int, task: asyncio.Future[Outcome]) -> None:
        entry = self.running.pop(job_id, None)
        if entry is None or task.cancelled():
            return
        self.done.append((entry[2], task.result()))
        self.wake()

    async def write_outcomes(self, route: Route) -> bool:
        """The outcomes in one transaction a node (through the coordinator, one a shard);
        those of a group that could not be written stay, for the next call."""
        done, self.done = self.done, []
        by_shard: dict[str, list[Outcome]] = defaultdict(list)
        for shard, outcome in done:
            if not outcome.settled:
                by_shard[shard].append(outcome)
        groups = route.together(list(by_shard))
        for index, group in enumerate(groups):
            try:
                await route.write(group, partial(self._write_shard, by_shard))
            except BaseException:
                left = [shard for later in groups[index:] for shard in later]
                self.done = [(s, o) for s in left for o in by_shard[s]] + self.done
                raise
            self.finished += sum(len(by_shard[shard]) for shard in group)
        return True

    def _write_shard(
        self, by_shard: dict[str, list[Outcome]], conn: AsyncConn, shard: str, tables: Tables
    ) -> Awaitable[int]:
        outcomes = by_shard[shard]
        final = [o.as_row() for o in outcomes if o.status != "retry"]
        retried = [o.as_row() for o in outcomes if o.status == "retry"]
        return store.write_outcomes(
            conn, self.schema, shard, final, retried, self.keep_history, tables
        )

    async def drain(self, route: Route, grace: float, worker_id: int) -> None:
        """Give running jobs the grace, then cancel and put back the rest."""
        tasks = [task for task, _, _ in self.running.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        left = dict(self.running)
        for task, _, _ in left.values():
            task.cancel()
        self.running.clear()
        await self.write_outcomes(route)
        by_shard: dict[str, list[int]] = defaultdict(list)
        for job_id, (_, _, shard) in left.items():
            by_shard[shard].append(job_id)
        for shard, ids in by_shard.items():
            release = partial(self._release, shard=shard, ids=ids, worker_id=worker_id)
            await route.run(shard, release)
        if left:
            log.info("citus worker %s put back %d unfinished jobs", worker_id, len(left))

    async def _release(
        self, conn: AsyncConn, tables: Tables, *, shard: str, ids: list[int], worker_id: int
    ) -> int:
        return await store.release(conn, self.schema, shard, ids, worker_id, tables)
