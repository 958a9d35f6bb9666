"""One claim statement of a queue: which one it needs, and what its result says.

Owns: which queues are claimed with job_claim (a job with a concurrency key was seen there)
rather than job_claim_unkeyed, which costs what claims cost before keys existed, and which
with job_claim_rated.

Invariants:
- A queue is claimed with job_claim_rated while it has a rate limit, or while any task or key
  has one and a job with a key or of a limited task was seen there. job_claim_unkeyed is
  told the limited tasks and hands the queue over when it meets one; from then on the queue
  is keyed for good.
- Every job of a job_claim_rated claim carries the time it must start by
  (ClaimedJob.start_by): RATE_START_MARGIN after the statement was sent, since the limit
  counts the claim's time. A claim whose limit was full tells the controls when there is
  room again (controls.py); jobs it put back tell the promotion when they fall due
  (promotion.py).
- Jobs come back in (priority, id) order.

Fails: a claim that deadlocks on slot rows is tried again, CLAIM_RETRIES times in all; other
errors are the statement's, on the claim connection.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from pgqueue.models import RATE_START_MARGIN, ClaimedJob
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import Claimed, ClaimParams, ClaimSnapshot, JobsStore
from pgqueue.store.plan import AsyncConn
from pgqueue.wakeup import Position
from pgqueue.worker.controls import Controls
from pgqueue.worker.promotion import Promotion

CLAIM_RETRIES = 5
T = TypeVar("T")


async def _retrying(claim: Callable[[], Awaitable[T]]) -> T:
    """A claim that deadlocks on slot rows, tried again, CLAIM_RETRIES times in all."""
    for _ in range(CLAIM_RETRIES - 1):
        try:
            return await claim()
        except psycopg.errors.DeadlockDetected:
            pass
    return await claim()


@dataclass
class Batch:
    """One claim statement's result: the jobs to run, how many rows it walked (run or
    parked), and the highest position among them."""

    jobs: list[ClaimedJob]
    walked: int = 0
    top: Position | None = None
    throttled: bool = False  # the queue's rate limit had no room for all it asked for
    snapshot: ClaimSnapshot | None = None  # what its snapshot could not see (unkeyed claims)

    def __len__(self) -> int:
        """The jobs to run (test_faults.py counts a claim's result this way)."""
        return len(self.jobs)


class ClaimStatement:
    """Runs the claim statements of one worker."""

    def __init__(
        self,
        link: Link,
        store: JobsStore,
        worker_id: int,
        controls: Controls,
        promotion: Promotion,
    ) -> None:
        self.link = link
        self.store = store
        self.worker_id = worker_id
        self.controls = controls
        self.promotion = promotion
        # Queues where a job with a concurrency key was seen: claimed with job_claim, the
        # others with job_claim_unkeyed, which costs what claims cost before keys existed.
        self.keyed: set[str] = set()

    def rated(self, queue: str) -> bool:
        """Whether `queue` is claimed with job_claim_rated."""
        c = self.controls
        return queue in c.rated or (queue in self.keyed and bool(c.limited_tasks or c.key_limits))

    async def run(
        self, queue: str, after: Position, before: Position, limit: int
    ) -> tuple[Batch, float]:
        """Up to `limit` jobs of `queue` between `after` and `before`, and the seconds the
        statement took."""
        params = ClaimParams(
            queue,
            after,
            before,
            limit,
            self.worker_id,
            limited_tasks=sorted(self.controls.limited_tasks),
            job_limits=bool(self.controls.limited_tasks or self.controls.key_limits),
            start_margin=RATE_START_MARGIN,
        )

        room_in: float | None = None
        back_in: float | None = None
        sent: float | None = None  # when a claim under rate limits (job_claim_rated) was sent

        async def claim(conn: AsyncConn) -> Claimed:
            nonlocal room_in, back_in, sent
            if self.rated(queue):

                async def rated() -> tuple[Claimed, float, float | None]:
                    nonlocal sent
                    sent = time.monotonic()
                    return await self.store.claim_rated(conn, params)

                got, room_in, back_in = await _retrying(rated)
                return got
            if queue not in self.keyed:
                found = await self.store.claim_unkeyed(conn, params)
                if found is not None:
                    return found
                self.keyed.add(queue)  # for good: keyed (or rated) claims from now on
                if self.controls.limited_tasks or self.controls.key_limits:
                    return await claim(conn)
            return await _retrying(lambda: self.store.claim_keyed(conn, params))

        started = time.perf_counter()
        claimed = await self.link.run(claim)
        seconds = time.perf_counter() - started
        jobs = claimed.jobs
        if sent is not None and jobs:
            # The claim's time, which the limit counts, is after it was sent.
            start_by = sent + RATE_START_MARGIN.total_seconds()
            jobs = [dataclasses.replace(job, start_by=start_by) for job in jobs]
        jobs.sort(key=lambda j: (j.priority, j.id))
        throttled = room_in is not None and room_in > 0 and claimed.walked < limit
        self.controls.room_in(queue, float(room_in or 0.0) if throttled else None)
        if back_in is not None:  # jobs put back by their task's or key's limit: due then
            self.promotion.due_in(back_in)
        return Batch(jobs, claimed.walked, claimed.top, throttled, claimed.snapshot), seconds
