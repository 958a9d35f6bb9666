"""Pauses and rate limits as the worker knows them.

Owns: which of its queues are paused, which have a rate limit (and when a full one has room
again), which tasks and keys have limits, and which queues have had fair jobs.

Invariants:
- A paused queue is left out of claim rounds. Its pause is learnt from the pause notice
  (wakeup.py) and from the queue_pauses table, read at the first round, after the listener
  reconnects, and then every poll interval when nothing listens (a notice could be missed
  only then), else every hint_reset_interval as a safety net. The claim statements never
  read it. A notice heard while that table is being read wins over what the read returns,
  whose snapshot may predate it; otherwise the pause would go unheard until the next read.
- A queue resumed, heard or read, is claimed again from its first job (`resumed`): it may
  hold jobs below any hint by now. So is a queue whose rate limit was lifted while it was
  full.
- A queue with a rate limit (learnt the same way) is claimed with job_claim_rated. One that
  got fewer jobs than it asked for because the limit was full is left out until the
  statement said it has room again (`room_in`).
- Which queues have had fair jobs, and which tasks and keys have rate limits, are learnt
  with the pauses.

Fails: a read of the controls raises what its statement raises, on the claim connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pgqueue.models import WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.plan import run_async
from pgqueue.store.queues import controls_plan
from pgqueue.worker.events import Bus, ControlsChanged, PauseChanged


class Controls:
    """One worker's view of its queues' pauses and rate limits."""

    def __init__(
        self,
        link: Link,
        schema: str,
        settings: WorkerSettings,
        resumed: Callable[[str], None],
        *,
        listening: bool = True,
    ) -> None:
        self.link = link
        self.schema = schema
        self.settings = settings
        self.queues = frozenset(settings.queues)
        self._resumed = resumed  # a queue to claim again from its first job
        self._listening = listening
        self.paused: set[str] = set()
        self.rated: set[str] = set()
        self.limited_tasks: frozenset[str] = frozenset()  # tasks with a rate limit
        self.key_limits = False  # some concurrency key has a rate limit
        self.fair: set[str] = set()  # queues that have had fair jobs
        self._room_at: dict[str, float] = {}  # a full rate-limited queue: when it has room
        self._due = 0.0  # when pauses and rate limits are read next (monotonic)
        # Notices heard while a read of the controls is under way: that read's snapshot may
        # predate them, so they are applied again over what it returns.
        self._heard_pauses: dict[str, bool] | None = None
        self._reread = False

    def subscribe(self, events: Bus) -> None:
        """Hear of pauses and rate limits as the notifier publishes them."""
        events.subscribe(PauseChanged, lambda e: self.pause_changed(e.queue, e.paused))
        events.subscribe(ControlsChanged, lambda e: self.reread())

    def pause_changed(self, queue: str, paused: bool) -> None:
        """A pause notice: leave `queue` out of claim rounds, or claim it again from its first
        job (it may hold jobs below any hint by now)."""
        if queue not in self.queues:
            return
        if self._heard_pauses is not None:
            self._heard_pauses[queue] = paused
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)
            self._resumed(queue)

    def reread(self) -> None:
        """Read the pauses and rate limits before the next round (a notice may have been
        missed, or a rate limit changed)."""
        self._due = 0.0
        self._reread = True  # also when a read is under way: its snapshot may predate this

    def due(self, now: float) -> bool:
        """Whether the controls are to be read before the round starting at `now`."""
        return now >= self._due

    async def read(self) -> None:
        """Read the pauses and rate limits (controls_plan)."""
        self._heard_pauses, self._reread = {}, False
        try:
            controls = await self.link.run(lambda conn: run_async(conn, controls_plan(self.schema)))
        finally:
            heard, self._heard_pauses = self._heard_pauses or {}, None
        paused, rated = controls.paused, controls.rated
        self.limited_tasks, self.key_limits = controls.limited_tasks, controls.key_limits
        paused &= self.queues
        for queue in self.paused - paused:
            self._resumed(queue)  # resumed unheard of
        self.paused = paused
        self.rated = rated & self.queues
        self.fair = controls.fair & self.queues
        for queue in list(self._room_at):
            if queue not in self.rated:
                del self._room_at[queue]
                self._resumed(queue)
        for queue, now_paused in heard.items():
            self.pause_changed(queue, now_paused)
        if self._reread:
            self._due = 0.0
            return
        s = self.settings
        every = s.hint_reset_interval if self._listening else s.poll_interval
        self._due = time.monotonic() + every.total_seconds()

    def claimable(self, queue: str, now: float) -> bool:
        """Whether `queue` takes part in the round starting at `now`: not paused, and not a
        full rate-limited queue still without room."""
        return queue not in self.paused and self._room_at.get(queue, 0.0) <= now

    def room_in(self, queue: str, seconds: float | None) -> None:
        """A rated claim of `queue` found its limit full: it has room in `seconds`, or (None)
        it had room for all it asked for."""
        if seconds is None:
            self._room_at.pop(queue, None)
        else:
            self._room_at[queue] = time.monotonic() + seconds

    def room_due(self, now: float) -> bool:
        """Whether a full rate-limited queue has room again by `now`."""
        return any(at <= now for at in self._room_at.values())

    def rooms_after(self, now: float) -> list[float]:
        """When the full rate-limited queues have room again, those still to come."""
        return [at for at in self._room_at.values() if at > now]
