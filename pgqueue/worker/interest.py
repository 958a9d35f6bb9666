"""Which wake-ups a listening worker asks for, so that enqueues notify only when one helps.

Owns: this worker's rows in wake_listeners (sql/migrations/0015_quiet_wake.sql), one per
queue it serves, and the claim from the floor that closes the race when it asks for more.

Invariants:
- While the worker waits for work, it asks for every wake-up of its queues.
- While every slot is busy (and has been for the quiet_after setting), a queue's row skips
  the wake-ups of the priorities whose new jobs its next claim finds anyway, made as soon as a
  slot frees: from the claim hint's priority up, or the one priority of an announced range
  (claimer.wake_range). A job more urgent still is announced and moves the hint, as every
  job was before.
- While the worker is steady (loop.py: it claims every claim_cooldown because jobs keep
  arriving), the rows of the queues whose claims name the transactions they could not see
  (claimer.steady_eligible) skip the same priorities, for new jobs only (`new_only`): jobs
  that come back below the hint are still announced. A new job committed late below the
  hint is found by the claimer once its transaction has ended (hints.track).
- Asking for more (widening) is followed by a claim from the floor of the widened queues,
  which sees what was committed unannounced, and by another once the transactions that were
  in progress at the widening have ended: one of them may have checked the rows before the
  widening and commit after the claim. pg_xact_status says when they have ended; it is read
  again with backoff, at most every poll interval.
- Not for a steady queue's rows, which skipped new jobs only: its claims followed every
  transaction they could not see, so its hint is kept, the transactions in progress at the
  widening are followed from it, and each one's end sends the next claim back to where it
  was passed (hints.widen, hints.ended). Under a long transaction a claim from the floor
  walks every dead entry it keeps, and a worker that goes in and out of steady mode would
  make one at each spell's end.
- Nor for a queue claimed fairly: its fair jobs at the fair hint's priority or after are
  found from the hint however they became queued, so its next claim looks only at the more
  urgent priorities, and the plain hint stays, its safety net's next slice looked at
  (claimer.unannounced).
- quiet_after keeps a worker that only fills its slots now and then from toggling its rows,
  and with them the floor claims, at every claim.
- A job committed late, with an id below a busy worker's hint at a priority it skips, is not
  announced: the worker finds it with its next claim from the floor, when it runs out of
  work (a widening) or at the hint's periodic reset. quiet_after=None keeps every wake-up,
  steady or busy.
- Skipping only new jobs' wake-ups after skipping all of them is a widening too: the jobs
  that came back unannounced meanwhile sit below the hint.
- Rows are written on the claim connection and go with the worker's row. A worker presumed
  dead and revived (heartbeat.py) writes them again as a widening.

Fails: a write refused because the worker's row is gone is left for the next try (the
heartbeat puts the row back); connection faults are the link's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import psycopg

from pgqueue.runtime.link import Link
from pgqueue.store.plan import AsyncConn
from pgqueue.store.workers import WorkersStore
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.events import Bus, WorkerRevived

# The priorities, from and to, whose wake-ups a queue's row skips; and whether it skips only
# those of new jobs (a steady worker's), not of jobs that come back below its hint.
Skip = tuple[int, int, bool]
NOTHING: Skip = (32768, 32767, False)  # an empty range: every wake-up is wanted
EVERYTHING: Skip = (-32768, 32767, False)  # as good as no row: no wake-up is wanted
FIRST_CHECK = 0.005  # seconds after a widening that the transactions it waits for are looked at


class WakeInterest:
    def __init__(
        self, link: Link, schema: str, worker_id: int, claimer: Claimer, max_check: float
    ) -> None:
        self.link = link
        self.store = WorkersStore(schema)
        self.worker_id = worker_id
        self.claimer = claimer
        self.max_check = max_check  # the poll interval, in seconds
        self.skipped: dict[str, Skip] = {}  # as written; a queue missing has no row
        self._waiting_on: Sequence[int] = []  # transactions in progress at a widening
        self._widened: set[str] = set()  # hints forgotten again when one of those ends
        self._followed: set[str] = set()  # hints kept, whose watches those ends end
        self._check_at: float | None = None
        self._backoff = FIRST_CHECK
        self.widenings = 0
        self.busy_widenings = 0  # those that asked again for the wake-ups of jobs that came back
        self.settlements = 0  # watched transactions ending, each sending the next claim back

    async def ask(self, skip: Mapping[str, Skip | None]) -> bool:
        """Per queue, skip the wake-ups of the priorities in the range (None: skip none).
        True when a queue now asks for more: its hint is forgotten, and the worker should
        claim again."""
        wanted = {q: NOTHING if r is None else r for q, r in skip.items()}
        changed = {q: r for q, r in wanted.items() if self.skipped.get(q) != r}
        if not changed:
            return False
        widened = {q for q, r in changed.items() if not _within(self.skipped.get(q), r)}

        async def write(conn: AsyncConn) -> Sequence[int]:
            await self.store.skip_wakes(conn, self.worker_id, changed)
            return await self.store.in_progress(conn) if widened else []

        try:
            in_progress = await self.link.run(write)
        except psycopg.errors.ForeignKeyViolation:
            return False  # the worker's row is gone: presumed dead until its next heartbeat
        was = {q: self.skipped.get(q) for q in widened}
        self.skipped.update(changed)
        if not widened:
            return False
        self.widenings += 1
        if any(w is not None and w[0] <= w[1] and not w[2] for w in was.values()):
            self.busy_widenings += 1
        running = set(in_progress)
        # A steady queue's rows skipped new jobs only, whose transactions its claims follow:
        # its hint is kept (hints.widen). Other rows skipped jobs that came back too, which
        # nothing follows: those hints are forgotten.
        followed = {
            q for q, w in was.items() if w is not None and w[2] and self.claimer.widen(q, running)
        }
        forgotten = widened - followed
        self._forget(forgotten)
        if in_progress:
            self._waiting_on = sorted(set(self._waiting_on) | running)
            self._widened |= forgotten
            self._followed |= followed
            self._backoff = FIRST_CHECK
            self._check_at = time.monotonic() + self._backoff
        return True

    async def settle(self) -> bool:
        """If some transactions that a widening waits for have ended, forget the hints of the
        queues widened (the next claim starts from the floor), or for a steady queue's, send
        its next claim back to where the hint was then (hints.ended). True when it did."""
        if self._check_at is None or time.monotonic() < self._check_at:
            return False
        waiting_on = self._waiting_on
        left = await self.link.run(lambda conn: self.store.still_in_progress(conn, waiting_on))
        ended = set(waiting_on).difference(left)
        if ended:
            self.settlements += 1
            self._forget(self._widened)
            for queue in self._followed:
                self.claimer.hints.ended(queue, ended)
        self._waiting_on = left
        if left:
            self._backoff = min(self._backoff * 2, self.max_check)
            self._check_at = time.monotonic() + self._backoff
        else:
            self._widened, self._followed, self._check_at = set(), set(), None
        return bool(ended)

    def next_check(self) -> float | None:
        """The monotonic time settle() has something to look at, if any."""
        return self._check_at

    def subscribe(self, events: Bus) -> None:
        """Write the rows again when the heartbeat revives the worker's row."""
        events.subscribe(WorkerRevived, lambda e: self.lost())

    def lost(self) -> None:
        """The rows are gone (the worker's row was removed): write them all again."""
        self.skipped = {}

    def _forget(self, queues: set[str]) -> None:
        for queue in queues:
            self.claimer.unannounced(queue)


def _within(before: Skip | None, after: Skip) -> bool:
    """Whether every wake-up skipped before is skipped after (no row skipped everything)."""
    low, high, new_only = EVERYTHING if before is None else before
    if low > high:
        return True
    return after[0] <= low and high <= after[1] and (new_only or not after[2])
