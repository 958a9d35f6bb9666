"""The fair claim's hints: where each fair queue's next job_claim_fair starts.

Owns: per queue, the (priority, vtime) after which this worker's fair claims start.

Invariants:
- A fair claim starts at the hint: the highest (priority, vtime) this worker's claims had
  reached before its last one, an index start bound, so the dead entries a long transaction
  keeps below it are never walked, and the last claim's range is walked again (a batch of
  entries). A job that becomes queued is moved at commit to at least its queue's clock, as
  every claim that committed before it could be seen left it (migration 0030): so it is at
  or after the hint of any worker's claim that can see it. The claim misses only jobs of more
  urgent priorities than the hint's: a wake-up at such a priority, or one that says nothing
  of where, sends the next claim to the floor.
- The safety net, as for the plain claim, is a sweep (sweep.py, job_sweep_find_fair): after
  each jittered hint_reset_interval, one slice of the table's pages is looked at, and the
  fair jobs it holds before the hint (one a claim passed while another held it locked, then
  released unclaimed) are claimed each at its own (priority, vtime), a walk that ends there.
  The hint is not dropped, so no reset walks the dead entries a long transaction keeps below
  it; a cycle of slices reaches every job.
- After wake-ups went unheard while the worker was busy (a widening), the next claim walks
  only the priorities more urgent than the hint's (`unannounced`): at the hint's priority
  and after, every job is found from the hint, as said above.
- Claims from the floor are left for the first claim, a wake-up more urgent than the hint or
  that says nothing of where, a forgotten hint (a queue resumed, the listener lost), and
  polling without a listener, where no wake-up announces a more urgent job and the hint is
  still forgotten every hint_reset_interval instead. Each walks every dead entry below the
  jobs it finds (bench/notes say what that costs). If a claim from the floor finds nothing,
  nothing was left behind: claims go on from where those before it had reached, rather than
  each walking from the floor again while other workers take every new job first.

The claimer (claimer.py) calls `claim` first for a queue that has had fair jobs, and claims
the rest of the round's room with the plain claim (jobs without a fairness key). Deadlocks
on slot rows are retried, as there.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import psycopg

from pgqueue.models import WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.fairness import (
    FAIR_FLOOR,
    FairClaimed,
    FairClaimParams,
    FairPosition,
    claim_fair,
    sweep_find_fair,
)
from pgqueue.store.plan import AsyncConn
from pgqueue.wakeup import Position
from pgqueue.worker.sweep import SWEEP_FOUND, Sweep

CLAIM_RETRIES = 5
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767  # the claim's floor and ceiling priorities


@dataclass
class _FairHint:
    after: tuple[int, float] | None = None  # where claims start; None: from the floor
    reached: tuple[int, float] | None = None  # the highest any claim reached so far
    deadline: float = 0.0
    before_reset: tuple[int, float] | None = None  # what the claims had reached at the reset
    resets: int = 0  # how many resets so far: a claim that saw one come is not from the floor
    urgent: bool = False  # more urgent jobs than the hint's may have gone unannounced

    def moved(self, top: tuple[int, float] | None, *, from_floor: bool = False) -> None:
        """A claim walked up to `top` (None: it found nothing): the next one starts where
        the claims before it had reached. An empty claim moves the start too, or after a
        reset every empty claim would start at the floor again and walk the dead entries
        there. An empty claim from the floor found nothing claimable anywhere: the reset
        has done its work, and claims go on from where those before it had reached, which
        all committed before it began (`from_floor`: the claim started at the floor, and
        no reset came while it ran)."""
        if top is None and from_floor and self.reached is None:
            self.reached = self.before_reset
        self.after = self.reached
        if top is not None:
            self.reached = top if self.reached is None else max(self.reached, top)

    def forget(self) -> None:
        self.urgent = False
        self.resets += 1
        self.before_reset = self.reached or self.before_reset
        self.after = self.reached = None


class FairHints:
    def __init__(
        self,
        link: Link,
        schema: str,
        settings: WorkerSettings,
        worker_id: int,
        *,
        listening: bool = True,
    ) -> None:
        self.link = link
        self.schema = schema
        self.settings = settings
        self.worker_id = worker_id
        self._hints: dict[str, _FairHint] = {}
        self._rng = random.Random()
        self.from_floor = False  # whether the last claim started at the floor, unhinted
        # The safety net's sweeps (None: no listener, so the hint is forgotten instead).
        self._sweeps: dict[str, Sweep[FairPosition]] | None = {} if listening else None
        self.sweeps = 0  # slices looked at

    def announce(self, queue: str, position: Position | None) -> None:
        """A wake-up in `queue`: claim from the floor next if it may lie before the hint."""
        hint = self._hints.get(queue)
        if hint is None or hint.after is None:
            return
        if position is None or position[0] < hint.after[0]:
            hint.forget()

    def forget(self) -> None:
        for hint in self._hints.values():
            hint.forget()

    def unannounced(self, queue: str) -> None:
        """Wake-ups of `queue` in wake_range went unheard (the worker was busy), or may have
        (an enqueue in progress then): its jobs at the hint's priority or after are found
        from the hint however they became queued, as every way to 'queued' stamps them at
        or past the queue's clock. Only more urgent ones may sit before it, so the next
        claim first walks those priorities alone, not from the floor, where a long
        transaction keeps a dead entry for every fair job claimed."""
        hint = self._hints.get(queue)
        if hint is not None and hint.after is not None:
            hint.urgent = hint.after[0] > PRIORITY_MIN

    def wake_range(self, queue: str) -> tuple[int, int]:
        """While every slot is busy: the priorities whose new jobs the next fair claim finds
        without a wake-up: its hint's and after (every one from the floor). A more urgent job
        is announced, and its wake-up sends the claim to the floor."""
        hint = self._hints.get(queue)
        if hint is None or hint.after is None:
            return PRIORITY_MIN, PRIORITY_MAX
        return hint.after[0], PRIORITY_MAX

    async def claim(self, queue: str, want: int) -> FairClaimed:
        """Up to `want` fair jobs of `queue` from its hint; moves the hint past them."""
        hint = self._hints.setdefault(queue, _FairHint())
        now = time.monotonic()
        if hint.reached is not None and now >= hint.deadline:
            if self._sweeps is not None and hint.after is not None:
                self._sweeps.setdefault(queue, Sweep()).due = True
                self._reset_deadline(hint, now)
            else:
                hint.forget()
        if hint.reached is None:
            self._reset_deadline(hint, now)
        self.from_floor = False
        first = await self._claim_urgent(queue, hint, want)
        if first.walked < want:
            first = _joined(first, await self._claim_swept(queue, hint, want - first.walked))
        if first.walked >= want:
            return first
        self.from_floor = hint.after is None
        resets = hint.resets
        params = FairClaimParams(
            queue, hint.after or FAIR_FLOOR, want - first.walked, self.worker_id
        )
        got = await self._run(params)
        hint.moved(got.top, from_floor=self.from_floor and hint.resets == resets)
        return _joined(first, got) if first.walked else got

    def _reset_deadline(self, hint: _FairHint, now: float) -> None:
        s = self.settings
        spread = self._rng.uniform(1 - s.hint_reset_jitter, 1 + s.hint_reset_jitter)
        hint.deadline = now + s.hint_reset_interval.total_seconds() * spread

    async def _claim_urgent(self, queue: str, hint: _FairHint, want: int) -> FairClaimed:
        """After unannounced(): the jobs of priorities more urgent than the hint's, each
        claim's walk ending before the hint's priority (its top is None: the hint stays)."""
        if not hint.urgent or hint.after is None:
            return FairClaimed([], 0, None)
        before = (hint.after[0] - 1, float("inf"))
        got = await self._run(FairClaimParams(queue, FAIR_FLOOR, want, self.worker_id, before))
        hint.urgent = got.walked >= want  # a full claim: more may wait there
        return FairClaimed(got.jobs, got.walked, None, got.top_id)

    async def _claim_swept(self, queue: str, hint: _FairHint, want: int) -> FairClaimed:
        """The safety net: look at the sweep's next slice when a reset asked for it, and
        claim the fair jobs it found before the hint, each at its own position (its top is
        None: the hint stays where it was)."""
        sweep = self._sweeps.get(queue) if self._sweeps is not None else None
        if sweep is None or hint.after is None:
            return FairClaimed([], 0, None)  # a claim from the floor is next: it covers all
        if sweep.due and not sweep.pending:
            sweep.due = False
            pages, before = sweep.slice(), hint.after
            found = await self.link.run(
                lambda conn: sweep_find_fair(conn, self.schema, queue, pages, before, SWEEP_FOUND)
            )
            sweep.found(found.pages, found.jobs)
            self.sweeps += 1
        swept = FairClaimed([], 0, None)
        while sweep.pending and swept.walked < want:
            at = sweep.pending.pop(0)
            got = await self._run(FairClaimParams(queue, at, 1, self.worker_id, before=at))
            swept.jobs += got.jobs
            swept.walked += got.walked
            tops = [p for p in (swept.top_id, got.top_id) if p is not None]
            swept.top_id = max(tops, default=None)
        return swept

    async def _run(self, params: FairClaimParams) -> FairClaimed:
        async def run(conn: AsyncConn) -> FairClaimed:
            for _ in range(CLAIM_RETRIES - 1):
                try:
                    return await claim_fair(conn, self.schema, params)
                except psycopg.errors.DeadlockDetected:
                    pass
            return await claim_fair(conn, self.schema, params)

        return await self.link.run(run)


def _joined(first: FairClaimed, then: FairClaimed) -> FairClaimed:
    """Two claims of one round as one: the jobs of both, and the second's top (the hint's)."""
    tops = [at for at in (first.top_id, then.top_id) if at is not None]
    return FairClaimed(
        first.jobs + then.jobs, first.walked + then.walked, then.top, max(tops, default=None)
    )
