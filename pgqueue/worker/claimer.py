"""Claiming: the claim rounds across a worker's queues, and each queue's batch.

Owns: the order of a round (from a random queue), how a queue's room is split between its
claims (the fair claim first, then the announced urgent ranges, the sweep's finds, and the
claim from the hint), and the jobs in hand while a round runs. It asks the hints where each
claim starts (hints.py, whose invariants say why no job is left behind a hint), the controls
which queues take part (controls.py), the statement runner how to claim (statement.py), and
leaves due scheduled jobs to the promotion (promotion.py).

Invariants:
- A round claims at most the free slots, at most batch_size per queue, in (priority, id)
  order per claim; parked jobs (their concurrency key is full) are not run, but count as
  walked, and a queue whose claims walked all they asked for may have more (`full`).
- A queue that has had jobs with a fairness key is claimed first with job_claim_fair, in
  (priority, vtime) order from its own hint (fair.py), then with the plain claim for the rest
  of the round's room. A queue claimed with job_claim_rated is not: fair shares do not
  combine with rate limits.
- A rated claim that found its limit full leaves the hint where its last job was: the jobs
  it did not take are still there.
- Every job claimed is in hand (`in_hand`) from the moment its claim returns, so a broken
  connection during the round's next claim does not make it look like an orphan.

Runs on the worker's claim connection; nothing is raised here but what the statements raise.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection

from pgqueue.models import ClaimedJob, WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import JobsStore
from pgqueue.wakeup import Position
from pgqueue.worker.controls import Controls
from pgqueue.worker.events import Bus, JobsAnnounced, Relistened
from pgqueue.worker.fair import FairHints
from pgqueue.worker.hints import CEILING, FLOOR, MAX_ID, Hints, QueueHint
from pgqueue.worker.observe import Observers, WorkerStats
from pgqueue.worker.promotion import Promotion
from pgqueue.worker.statement import Batch, ClaimStatement
from pgqueue.worker.sweep import SWEEP_FOUND, Sweep


class Claimer:
    """One worker's claims: a round across its queues, each queue's batch."""

    def __init__(
        self,
        link: Link,
        schema: str,
        settings: WorkerSettings,
        worker_id: int,
        stats: WorkerStats,
        observers: Observers | None = None,
        *,
        listening: bool = True,
    ) -> None:
        self.observers = observers or Observers()
        self.link = link
        self.schema = schema
        self.settings = settings
        self.worker_id = worker_id
        self.stats = stats
        self.store = JobsStore(schema)
        self.hints = Hints(settings, listening=listening)
        self.controls = Controls(
            link, schema, settings, lambda queue: self.announce(queue, None), listening=listening
        )
        # The safety net's sweeps; without a listener short claims go to the floor anyway.
        self._sweeps: dict[str, Sweep[Position]] = (
            {q: Sweep() for q in settings.queues} if listening else {}
        )
        self.sweeps = 0  # slices looked at
        # Wake-ups say where jobs appear only when a listener runs.
        self._announced = listening
        self.promotion = Promotion(link, self.store, settings, stats)
        self.statement = ClaimStatement(link, self.store, worker_id, self.controls, self.promotion)
        self._rng = random.Random()
        # Jobs claimed in the current round, from the moment their claim returns: a broken
        # connection during the round's next claim must not make them look like orphans.
        self.in_hand: list[ClaimedJob] = []
        self._fair = FairHints(link, schema, settings, worker_id, listening=listening)

    def subscribe(self, events: Bus) -> None:
        """Hear of wake-ups, pauses and rate limits as the notifier publishes them."""
        events.subscribe(JobsAnnounced, lambda e: self.announce(e.queue, e.position))
        events.subscribe(Relistened, lambda e: self._relistened())
        self.controls.subscribe(events)

    def _relistened(self) -> None:
        """Wake-ups and pause notices sent while nothing listened were missed: claim from the
        floor and read the pauses again."""
        self.forget_hints()
        self.hints.unheard()
        self.controls.reread()

    def announce(self, queue: str, position: Position | None) -> None:
        """A wake-up: jobs became claimable in `queue` at `position` or after it (None: where
        is not known, so the next claim starts from the floor)."""
        if queue in self.hints.queues:
            self._fair.announce(queue, position)
            self.hints.announce(queue, position)

    def unannounced(self, queue: str) -> None:
        """Wake-ups of `queue` went unheard while busy (interest.py): the fair hint looks where
        they could be (fair.unannounced); the plain one claims from the floor, or in a fair
        queue, whose claim index keeps a dead entry for every fair job, looks at a slice."""
        sweep, fair = self._sweeps.get(queue), queue in self.controls.fair
        if queue in self.hints.queues:
            self._fair.unannounced(queue)
            if fair and not self._rated(queue) and sweep and self.hints[queue].after:
                sweep.due = True
            else:
                self.hints.announce(queue, None)

    def wake_range(self, queue: str) -> tuple[int, int] | None:
        """While every slot is busy: the priorities whose new jobs in `queue` the next claim
        finds without a wake-up (hints.py; the fair claim's for a fair queue)."""
        if queue in self.controls.fair and not self._rated(queue):
            return self._fair.wake_range(queue)
        return self.hints.wake_range(queue)

    def widen(self, queue: str, in_progress: Collection[int]) -> bool:
        """A steady queue's rows ask for every wake-up again: keep its hint if it can be kept
        (hints.widen); the fair hint, unused by a steady queue, is forgotten."""
        self._fair.announce(queue, None)
        return self.hints.widen(queue, in_progress)

    def steady_eligible(self, queue: str) -> bool:
        """Whether `queue`'s claims say which transactions they could not see (the unkeyed
        claim, without rate limits or fair shares), so that it may skip new jobs' wake-ups."""
        return (
            self._announced
            and queue not in self.statement.keyed
            and queue not in self.controls.fair
            and not self._rated(queue)
        )

    def forget_hints(self) -> None:
        """Claim every queue from the floor next time (jobs may sit below any hint now)."""
        self.hints.forget()
        self._fair.forget()

    async def claim_round(self, free: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to `free` jobs across the queues, starting at a random one; `full` if
        some queue may have more."""
        claimed: list[ClaimedJob] = []
        self.in_hand = claimed
        full = False
        now = time.monotonic()
        if self.controls.due(now):
            await self.controls.read()
        queues = [q for q in self.settings.queues if self.controls.claimable(q, now)]
        if not queues:
            return claimed, full
        start = self._rng.randrange(len(queues))
        for queue in queues[start:] + queues[:start]:
            want = min(free - len(claimed), self.settings.batch_size)
            if want <= 0:
                break
            _, queue_full = await self._claim_queue(queue, want)
            full = full or queue_full
        return claimed, full

    async def _claim_queue(self, queue: str, want: int) -> tuple[list[ClaimedJob], bool]:
        if queue not in self.controls.fair or self._rated(queue):
            return await self._claim_plain(queue, want)
        started = time.perf_counter()
        got = await self._fair.claim(queue, want)
        seconds = time.perf_counter() - started
        self._claimed(seconds, got.jobs, got.walked, unhinted=self._fair.from_floor)
        if got.walked == want:
            return got.jobs, True
        jobs, full = await self._claim_plain(queue, want - got.walked)
        if not full and got.top_id is not None:
            self.hints.passed(queue, got.top_id)
        return got.jobs + jobs, full

    def _rated(self, queue: str) -> bool:
        return self.statement.rated(queue)

    def _claimed(self, seconds: float, jobs: list[ClaimedJob], walked: int, unhinted: bool) -> None:
        self.stats.count_claim(seconds, len(jobs), walked, unhinted)
        self.observers.claimed(seconds, len(jobs))
        self.in_hand.extend(jobs)

    async def _claim_plain(self, queue: str, want: int) -> tuple[list[ClaimedJob], bool]:
        hint = self.hints[queue]
        left = hint.after  # where the claims before left it, before a step back or a drop
        self.hints.absorb(hint, self._sweeps.get(queue))
        jobs, walked = await self._claim_urgent(queue, hint, want)
        if walked < want:
            swept, swept_walked = await self._claim_swept(queue, hint, want - walked)
            jobs, walked = jobs + swept, walked + swept_walked
        if walked == want:
            return jobs, True
        after, rest = hint.after, want - walked
        dropped = after is None  # this claim starts from the floor
        start = self.hints.early(queue, hint)
        main = await self._claim(queue, start or after or FLOOR, CEILING, rest)
        if main.throttled:
            # The limit had no room for the rest: the jobs not taken are still there.
            if main.top is not None:
                hint.after = main.top
            return jobs + main.jobs, False
        if after is not None and main.walked < rest and not self._announced:
            # No wake-up says where jobs appear: something may sit below the hint.
            after = None
            more = await self._claim(queue, FLOOR, CEILING, rest - main.walked)
            main.jobs += more.jobs
            main.walked += more.walked
            main.top = (
                max(p for p in (main.top, more.top) if p is not None) if more.top else main.top
            )
        short = walked + main.walked < want
        self.hints.claimed(queue, hint, left, after, start, main.top, main.snapshot, short)
        hint.unheard = hint.unheard and not dropped
        jobs += main.jobs
        return jobs, walked + main.walked == want

    async def _claim_urgent(
        self, queue: str, hint: QueueHint, want: int
    ) -> tuple[list[ClaimedJob], int]:
        """Claim the announced ranges of more urgent priorities than the hint's, in order;
        returns the jobs and how many rows were walked."""
        jobs: list[ClaimedJob] = []
        walked = 0
        for priority in sorted(hint.urgent):
            ask = want - walked
            got = await self._claim(
                queue, (priority, hint.urgent[priority]), (priority, MAX_ID), ask
            )
            jobs += got.jobs
            walked += got.walked
            if got.throttled:  # the rate limit is full: the range is not drained
                if got.top is not None:
                    hint.urgent[priority] = got.top[1]
                return jobs, want  # as if full: the round claims no more of this queue
            if got.walked < ask or got.top is None:
                del hint.urgent[priority]  # that priority is drained
            else:
                hint.urgent[priority] = got.top[1]
                break
        return jobs, walked

    async def _claim_swept(
        self, queue: str, hint: QueueHint, want: int
    ) -> tuple[list[ClaimedJob], int]:
        """The safety net: look at the sweep's next slice when a reset asked for it, and
        claim the jobs it found at or before the hint, each at its own position; returns
        the jobs and how many rows were walked."""
        sweep = self._sweeps.get(queue)
        if sweep is None or hint.after is None:
            return [], 0  # a claim from the floor is next: it covers everything
        if sweep.due and not sweep.pending:
            sweep.due = False
            pages, before = sweep.slice(), hint.after
            found = await self.link.run(
                lambda conn: self.store.sweep_find(conn, queue, pages, before, SWEEP_FOUND)
            )
            sweep.found(found.pages, found.jobs)
            self.sweeps += 1
        jobs: list[ClaimedJob] = []
        walked = 0
        while sweep.pending and walked < want:
            priority, job_id = sweep.pending.pop(0)
            got = await self._claim(queue, (priority, job_id - 1), (priority, job_id + 1), 1)
            jobs += got.jobs
            walked += got.walked
            if got.throttled:  # the rate limit is full: this job waits for the next round
                sweep.pending.insert(0, (priority, job_id))
                return jobs, want
        return jobs, walked

    async def _claim(self, queue: str, after: Position, before: Position, limit: int) -> Batch:
        batch, seconds = await self.statement.run(queue, after, before, limit)
        self._claimed(seconds, batch.jobs, batch.walked, unhinted=after == FLOOR)
        return batch

    def promotion_due(self, now: float) -> bool:
        return self.promotion.due(now)

    async def promote(self) -> int:
        """Move due scheduled jobs to queued (promotion.py)."""
        return await self.promotion.promote()

    def next_wake(self) -> float:
        """The monotonic time of the next promotion this worker must do, or of the next room
        in a full rate-limited queue, whichever is first."""
        # A room time already past is the fetch loop's to act on (room_due), not a wake-up:
        # with every slot busy it would wake the loop again and again until one frees.
        return min([self.promotion.next_at(), *self.controls.rooms_after(time.monotonic())])
