"""Promotion: due scheduled jobs moved to queued, and when that is next due.

Owns: when this worker next promotes. After a full batch, at once; otherwise after the poll
interval, or when the first scheduled job falls due if that is sooner: the one the statement
names (by the server's clock), or a job a rated claim put back for later (claimer.py).

Fails: the statement's errors, on the claim connection, are the caller's.
"""

from __future__ import annotations

import time

from pgqueue.models import WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import JobsStore
from pgqueue.worker.observe import WorkerStats


class Promotion:
    """When due scheduled jobs of the worker's queues are next promoted."""

    def __init__(
        self, link: Link, store: JobsStore, settings: WorkerSettings, stats: WorkerStats
    ) -> None:
        self.link = link
        self.store = store
        self.settings = settings
        self.stats = stats
        self._next_promote = 0.0
        self._next_due: float | None = None

    def due(self, now: float) -> bool:
        return now >= self._next_promote or (self._next_due is not None and now >= self._next_due)

    def due_in(self, seconds: float) -> None:
        """A job falls due in `seconds` (one a rated claim put back)."""
        due = time.monotonic() + max(seconds, 0.0)
        self._next_due = due if self._next_due is None else min(self._next_due, due)

    async def promote(self) -> int:
        """Move due scheduled jobs to queued; remember when the next one falls due."""
        s = self.settings
        promoted, next_due_in = await self.link.run(
            lambda conn: self.store.promote_due(conn, s.queues, s.promote_batch)
        )
        now = time.monotonic()
        self._next_promote = (
            now if promoted == s.promote_batch else (now + s.poll_interval.total_seconds())
        )
        self.stats.promoted += promoted
        self._next_due = None
        if next_due_in is not None:  # seconds by the server's clock; infinite for infinity
            self._next_due = now + max(next_due_in, 0.0)
        return promoted

    def next_at(self) -> float:
        """The monotonic time of the next promotion this worker must do."""
        if self._next_due is None:
            return self._next_promote
        return min(self._next_promote, self._next_due)
