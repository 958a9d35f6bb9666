"""Claiming: the per-queue hints, the claim statement and the promotion of due jobs.

Owns: where each queue's next claim starts. Claims take a batch of at most the free slots per
queue, in (priority, id) order, after a hint: the last (priority, id) claimed, written as a
row comparison so it is an index start bound and dead entries below it are never walked (seed
002). The hint is forgotten after a randomised interval (hint_reset_interval ± jitter) and
whenever a hinted claim comes back short, so a job committed late with a lower id, or one
promoted from scheduled, waits at most one reset interval (tests/integration/test_hint.py).
Also owns when due scheduled jobs are next promoted. Runs all its statements on the worker's
claim connection; raises nothing of its own.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pgqueue.link import Link
from pgqueue.models import ClaimedJob, WorkerSettings
from pgqueue.queries import query

FLOOR = (-32768, 0)  # below every (priority, id): an unhinted claim


@dataclass
class WorkerStats:
    claimed: int = 0
    claims: int = 0
    unhinted_claims: int = 0
    promoted: int = 0
    started: float = field(default_factory=time.monotonic)


class Claimer:
    def __init__(
        self,
        link: Link,
        schema: str,
        settings: WorkerSettings,
        worker_id: int,
        stats: WorkerStats,
    ) -> None:
        self.link = link
        self.schema = schema
        self.settings = settings
        self.worker_id = worker_id
        self.stats = stats
        self._hints: dict[str, tuple[int, int] | None] = {q: None for q in settings.queues}
        self._hint_deadline: dict[str, float] = {q: 0.0 for q in settings.queues}
        self._rng = random.Random()
        self._next_promote = 0.0
        self._next_due: float | None = None
        # Jobs claimed in the current round, from the moment their claim returns: a broken
        # connection during the round's next claim must not make them look like orphans.
        self.in_hand: list[ClaimedJob] = []

    async def claim_round(self, free: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to `free` jobs across the queues, starting at a random one; `full` if
        some queue may have more."""
        claimed: list[ClaimedJob] = []
        self.in_hand = claimed
        full = False
        queues = list(self.settings.queues)
        start = self._rng.randrange(len(queues))
        for queue in queues[start:] + queues[:start]:
            want = min(free - len(claimed), self.settings.batch_size)
            if want <= 0:
                break
            _, queue_full = await self._claim_queue(queue, want)
            full = full or queue_full
        return claimed, full

    async def _claim_queue(self, queue: str, want: int) -> tuple[list[ClaimedJob], bool]:
        hint = self._hints[queue]
        if hint is not None and time.monotonic() >= self._hint_deadline[queue]:
            hint = None
        jobs = await self._claim(queue, hint or FLOOR, want)
        last, last_want = jobs, want
        if hint is not None and len(jobs) < want:
            # Short: something may sit below the hint (committed late, promoted, put back).
            hint = None
            last_want = want - len(jobs)
            last = await self._claim(queue, FLOOR, last_want)
            jobs = jobs + last
        if hint is None:
            self._reset_hint_deadline(queue)
        self._hints[queue] = _next_hint(jobs, last, last_want, hint)
        return jobs, len(jobs) == want

    async def _claim(self, queue: str, after: tuple[int, int], limit: int) -> list[ClaimedJob]:
        params = {
            "queue": queue,
            "after_priority": after[0],
            "after_id": after[1],
            "limit": limit,
            "worker_id": self.worker_id,
            "now": None,
        }

        async def claim(conn: Any) -> list[Any]:
            cur = await conn.execute(query("job_claim", self.schema), params)
            rows: list[Any] = await cur.fetchall()
            return rows

        rows = await self.link.run(claim)
        self.stats.claims += 1
        if after == FLOOR:
            self.stats.unhinted_claims += 1
        self.stats.claimed += len(rows)
        jobs = [ClaimedJob(*row) for row in rows]
        jobs.sort(key=lambda j: (j.priority, j.id))
        self.in_hand.extend(jobs)
        return jobs

    def _reset_hint_deadline(self, queue: str) -> None:
        s = self.settings
        spread = self._rng.uniform(1 - s.hint_reset_jitter, 1 + s.hint_reset_jitter)
        self._hint_deadline[queue] = (
            time.monotonic() + s.hint_reset_interval.total_seconds() * spread
        )

    def forget_hints(self) -> None:
        """Claim every queue from the start next time (jobs were put back below the hints)."""
        self._hints = dict.fromkeys(self._hints)

    def promotion_due(self, now: float) -> bool:
        return now >= self._next_promote or (self._next_due is not None and now >= self._next_due)

    async def promote(self) -> int:
        """Move due scheduled jobs to queued; remember when the next one falls due."""
        s = self.settings
        params = {"queues": list(s.queues), "limit": s.promote_batch, "now": None}

        async def promote(conn: Any) -> tuple[int, Any]:
            cur = await conn.execute(query("job_promote_due", self.schema), params)
            row = await cur.fetchone()
            return int(row[0]), row[1]

        promoted, next_run_at = await self.link.run(promote)
        now = time.monotonic()
        self._next_promote = (
            now if promoted == s.promote_batch else (now + s.poll_interval.total_seconds())
        )
        self.stats.promoted += promoted
        self._next_due = None
        if next_run_at is not None:
            wait = (next_run_at - datetime.now(timezone.utc)).total_seconds()
            self._next_due = now + max(wait, 0.0)
        return promoted

    def next_wake(self) -> float:
        """The monotonic time of the next promotion this worker must do."""
        if self._next_due is None:
            return self._next_promote
        return min(self._next_promote, self._next_due)


def _next_hint(
    jobs: list[ClaimedJob], last: list[ClaimedJob], last_want: int, hint: tuple[int, int] | None
) -> tuple[int, int] | None:
    """Where the next claim of a queue starts.

    After a full batch, claimable jobs may follow right after it: start after its highest.
    After a short batch, nothing claimable was left past anything we took: start after the
    highest of all; and with nothing taken, keep the hint (None after a reset).
    """
    if last and len(last) == last_want:
        return max((j.priority, j.id) for j in last)
    if jobs:
        return max((j.priority, j.id) for j in jobs)
    return hint
