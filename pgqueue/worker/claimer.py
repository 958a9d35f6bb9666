"""Claiming: the per-queue hints, the claim statement and the promotion of due jobs.

Owns: where each queue's next claim starts, and when due scheduled jobs are next promoted.

Invariants:
- A claim takes at most the free slots, in (priority, id) order, after the queue's hint: the
  last position claimed, an index start bound, so dead entries below it are never walked.
- A job that becomes claimable below the hint is announced by its wake-up (wakeup.py), which
  moves the hint back, or opens a range at its more urgent priority. With no listener
  (poll_only without a listen DSN) a short hinted claim is retried from the floor at once.
- The safety net, for a job no wake-up named, is a sweep (sweep.py): after each jittered
  hint_reset_interval, one slice of the table's pages is looked at and its jobs at or before
  the hint claimed, each walk bounded by the slice; a cycle of slices reaches every job.
  test_hint.py and test_sweep.py pin each case.
- Claims from the floor, which walk every dead entry a long transaction keeps below the jobs
  they find, are left where a bound would lose a guarantee:
  - a worker's first claim, once per start: it has no hint yet;
  - a forgotten hint (forget_hints), once per event. The listener lost: the wake-ups sent
    meanwhile are gone, so a job may have come back below the hint anywhere, and it runs at
    the first claim after, where a sweep would find it only within a cycle (about a third of
    a long transaction's age). A queue resumed: no claim of it ran while it was paused, so
    the transactions its claims would have followed were not, and its resume may be learnt
    from the table, not heard; a start after the pause that keeps every job found at once
    is not shown here, so the resume still claims from the floor;
  - polling without a listener, after every short hinted claim: nothing announces a job
    that comes back below the hint (a retry, a promotion by another worker, a late commit),
    and it must run at the next poll. A worker that may face long transactions listens.
- A queue in `steady` (its rows skip new jobs' wake-ups, loop.py) hears of no new job, late
  commits included. Every unkeyed claim names the transactions in progress in its snapshot;
  those in progress when a claim moved the hint are watched, and once one has ended the next
  claim starts from where that claim began (sql/migrations/0035_steady_wake.sql says why that
  finds every such job; test_steady_wake.py). Not in the same round: the worker's own
  transactions and every other writer show up there too, and a claim more per round cost
  more than the cooldown's wait. While such a transaction is young, each claim starts
  where it was passed instead (_early), so its job is found by the first claim after its
  commit.
- A claim that stepped back (a rewind, an announced job) or started from the floor watches
  the transactions new to its snapshot from where the claims before it left the hint (or
  from its own top priority at that id, if more urgent), not from where it began: such a
  transaction drew its job ids after every id those claims saw, and while the hint is
  dropped the rows skip no priority more urgent than where it was (wake_range), so a more
  urgent job of its is announced. Otherwise each claim from the floor, or from an old
  rewind, would send the next one back there for as long as a transaction is in progress
  at each, and under a long transaction each walks every dead entry since (_watch_from).
  From the floor still for the first claim, after a hint parked past everything, and
  after the listener was lost.
- Parked jobs (their concurrency key is full) are not run, but count as walked.
- A paused queue is left out of claim rounds. Its pause is learnt from the pause notice
  (wakeup.py) and from the queue_pauses table, read at the first round, after the listener
  reconnects, and then every poll interval when nothing listens (a notice could be missed
  only then), else every hint_reset_interval as a safety net. The claim statements never
  read it. A notice heard while that table is being read wins over what the read returns,
  whose snapshot may predate it; otherwise the pause would go unheard until the next read.
- A queue with a rate limit (learnt the same way) is claimed with job_claim_rated, which
  claims only what the limit has room for. One that got fewer jobs than it asked for because
  the limit was full is left out until the statement said it has room again, and its hint
  does not move: the jobs it did not take are still there.
- Rate limits (a queue's, a task's, a key's) hold at handlers' starts: every job of a
  job_claim_rated claim must start within RATE_START_MARGIN of the claim (the statement and
  job_rate_admit count the starts of a period and that margin back); each carries the time
  it must start by (ClaimedJob.start_by), and the executor puts back one that could not
  start in time.
- A queue that has had jobs with a fairness key (learnt with the pauses) is claimed first
  with job_claim_fair, in (priority, vtime) order from its own hint (fair.py), then with the
  plain claim for the rest of the round's room. A queue claimed with job_claim_rated is not:
  fair shares do not combine with rate limits.
- While any task or key has a rate limit, the queues where a job with a key or of a limited
  task was seen are claimed with job_claim_rated, which puts jobs over their task's or key's
  limit back as scheduled; they count as walked, and the promotion is due when the first of
  them is. The other queues' claim (job_claim_unkeyed) is told the limited tasks and hands
  the queue over when it meets one, so they pay nothing for limits they never meet.

Runs on the worker's claim connection; a claim that deadlocks on slot rows is retried, and
nothing else is raised here.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import psycopg

from pgqueue.models import RATE_START_MARGIN, ClaimedJob, WorkerSettings
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import Claimed, ClaimParams, ClaimSnapshot, JobsStore
from pgqueue.store.plan import AsyncConn, run_async
from pgqueue.store.queues import controls_plan
from pgqueue.wakeup import Position
from pgqueue.worker.events import Bus, ControlsChanged, JobsAnnounced, PauseChanged, Relistened
from pgqueue.worker.fair import FairHints
from pgqueue.worker.observe import Observers, WorkerStats
from pgqueue.worker.sweep import SWEEP_FOUND, Sweep

FLOOR: Position = (-32768, 0)  # below every (priority, id): an unhinted claim
MAX_ID = 2**63 - 1
CEILING: Position = (32767, MAX_ID)  # above every (priority, id)
CLAIM_RETRIES = 5
# How long a transaction a steady claim passed unseen is taken for an enqueue about to commit
# (_early): longer than a commit waits for its WAL flush on a busy server, short enough that
# walking back to it covers only the jobs a steady worker claims meanwhile.
YOUNG_SECONDS = 0.02


@dataclass
class _Batch:
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


class _Seen(NamedTuple):
    """A transaction (or a range of them) a claim passed unseen: where the first such claim
    began, when (monotonic), and whether the queue was steady then."""

    at: Position
    since: float
    steady: bool

    def merged(self, other: _Seen) -> _Seen:
        """Seen again: from the earlier position, since the first time, steady if ever."""
        return _Seen(min(self.at, other.at), self.since, self.steady or other.steady)


@dataclass
class _QueueHint:
    """Where one queue's claims start. `after` None: from the floor."""

    after: Position | None = None
    # More urgent priorities than `after`'s with jobs announced below it: priority -> claim
    # after this id (a range up to the end of that priority).
    urgent: dict[int, int] = field(default_factory=dict)
    deadline: float = 0.0  # when `after` is next forgotten (the safety net)
    # Announced since the last claim round started; absorbed at the next one, so an
    # announcement that lands while a claim is in flight is never overwritten by its result.
    announced: dict[int, int] = field(default_factory=dict)
    forget: bool = False
    # Transactions in progress when a claim moved `after` past jobs it could not see: where
    # that claim began, to claim from again once they end (a job of theirs may commit there),
    # when the first such claim saw them (monotonic), and whether the queue was steady then.
    watch: dict[int, _Seen] = field(default_factory=dict)
    rewind: Position | None = None  # the next claim starts here if `after` is past it
    # Where `after` was when it was last dropped for a claim from the floor.
    before: Position | None = None
    # Wake-ups may have been missed (the listener was lost): the next claim from the floor
    # watches what it could not see from the floor, not from `before` (_watch_from).
    unheard: bool = False
    # Transaction ids that a claim which moved `after` could not name (its snapshot names
    # none from its xmax on, up to the claim's own id): one of them may own a job it passed.
    # Kept as a watch entry is, until a claim's snapshot names every id in the range.
    unnamed: tuple[int, int, _Seen] | None = None


class Claimer:
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
        self._hints = {q: _QueueHint() for q in settings.queues}
        # The safety net's sweeps; without a listener short claims go to the floor anyway.
        self._sweeps: dict[str, Sweep[Position]] = (
            {q: Sweep() for q in settings.queues} if listening else {}
        )
        self.sweeps = 0  # slices looked at
        # Queues where a job with a concurrency key was seen: claimed with job_claim, the
        # others with job_claim_unkeyed, which costs what claims cost before keys existed.
        self._keyed: set[str] = set()
        # Wake-ups say where jobs appear only when a listener runs.
        self._announced = listening
        self._rng = random.Random()
        self._next_promote = 0.0
        self._next_due: float | None = None
        # Jobs claimed in the current round, from the moment their claim returns: a broken
        # connection during the round's next claim must not make them look like orphans.
        self.in_hand: list[ClaimedJob] = []
        self.paused: set[str] = set()
        self.rated: set[str] = set()
        self.limited_tasks: frozenset[str] = frozenset()  # tasks with a rate limit
        self.key_limits = False  # some concurrency key has a rate limit
        self.fair: set[str] = set()  # queues that have had fair jobs
        self._fair = FairHints(link, schema, settings, worker_id, listening=listening)
        self._room_at: dict[str, float] = {}  # a full rate-limited queue: when it has room
        # Queues whose wake-up rows skip new jobs while the worker is steady (loop.py): a
        # watched transaction's end moves their hint back (_track).
        self.steady: set[str] = set()
        self.rewinds = 0
        self._controls_due = 0.0  # when pauses and rate limits are read next (monotonic)
        # Notices heard while a read of the controls is under way: that read's snapshot may
        # predate them, so they are applied again over what it returns.
        self._heard_pauses: dict[str, bool] | None = None
        self._reread = False

    def subscribe(self, events: Bus) -> None:
        """Hear of wake-ups, pauses and rate limits as the notifier publishes them."""
        events.subscribe(JobsAnnounced, lambda e: self.announce(e.queue, e.position))
        events.subscribe(PauseChanged, lambda e: self.pause_changed(e.queue, e.paused))
        events.subscribe(ControlsChanged, lambda e: self.reread_controls())
        events.subscribe(Relistened, lambda e: self._relistened())

    def _relistened(self) -> None:
        """Wake-ups and pause notices sent while nothing listened were missed: claim from the
        floor and read the pauses again."""
        self.forget_hints()
        for hint in self._hints.values():
            hint.unheard = True
        self.reread_controls()

    def announce(self, queue: str, position: Position | None) -> None:
        """A wake-up: jobs became claimable in `queue` at `position` or after it (None: where
        is not known, so the next claim starts from the floor)."""
        hint = self._hints.get(queue)
        if hint is None:
            return
        self._fair.announce(queue, position)
        if position is None:
            hint.forget = True
            return
        priority, job_id = position
        hint.announced[priority] = min(job_id, hint.announced.get(priority, MAX_ID))

    def pause_changed(self, queue: str, paused: bool) -> None:
        """A pause notice: leave `queue` out of claim rounds, or claim it again from its first
        job (it may hold jobs below any hint by now)."""
        if queue not in self._hints:
            return
        if self._heard_pauses is not None:
            self._heard_pauses[queue] = paused
        if paused:
            self.paused.add(queue)
        else:
            self.paused.discard(queue)
            self.announce(queue, None)

    def reread_controls(self) -> None:
        """Read the pauses and rate limits before the next round (a notice may have been
        missed, or a rate limit changed)."""
        self._controls_due = 0.0
        self._reread = True  # also when a read is under way: its snapshot may predate this

    async def _read_controls(self) -> None:
        self._heard_pauses, self._reread = {}, False
        try:
            controls = await self.link.run(lambda conn: run_async(conn, controls_plan(self.schema)))
        finally:
            heard, self._heard_pauses = self._heard_pauses or {}, None
        paused, rated = controls.paused, controls.rated
        self.limited_tasks, self.key_limits = controls.limited_tasks, controls.key_limits
        paused &= self._hints.keys()
        for queue in self.paused - paused:
            self.announce(queue, None)  # resumed unheard of
        self.paused = paused
        self.rated = rated & self._hints.keys()
        self.fair = controls.fair & self._hints.keys()
        for queue in list(self._room_at):
            if queue not in self.rated:
                del self._room_at[queue]
                self.announce(queue, None)
        for queue, now_paused in heard.items():
            self.pause_changed(queue, now_paused)
        if self._reread:
            self._controls_due = 0.0
            return
        s = self.settings
        every = s.hint_reset_interval if self._announced else s.poll_interval
        self._controls_due = time.monotonic() + every.total_seconds()

    def room_due(self, now: float) -> bool:
        """Whether a full rate-limited queue has room again by `now`."""
        return any(at <= now for at in self._room_at.values())

    def wake_range(self, queue: str) -> tuple[int, int] | None:
        """While every slot is busy: the priorities whose new jobs in `queue` the next claim
        finds without a wake-up (it starts from the floor, at the hint, or in an announced
        range); None when it may find none of them (a hint parked past everything)."""
        if queue in self.fair and not self._rated(queue):
            return self._fair.wake_range(queue)
        hint = self._hints[queue]
        if hint.forget or hint.after is None:
            # A claim from the floor is next: it finds every job committed by then, and what
            # it cannot see is watched from where the hint was (_watch_from), so a new job
            # more urgent than that must still be announced.
            was = hint.after if hint.forget else hint.before
            if hint.unheard or was is None or was == CEILING:
                return FLOOR[0], CEILING[0]
            return was[0], CEILING[0]
        if hint.after != CEILING:
            return hint.after[0], CEILING[0]
        if len(hint.urgent) == 1:
            (priority,) = hint.urgent
            return priority, priority
        return None

    def steady_eligible(self, queue: str) -> bool:
        """Whether `queue`'s claims say which transactions they could not see (the unkeyed
        claim, without rate limits or fair shares), so that it may skip new jobs' wake-ups."""
        return (
            self._announced
            and queue not in self._keyed
            and queue not in self.fair
            and not self._rated(queue)
        )

    def forget_hints(self) -> None:
        """Claim every queue from the floor next time (jobs may sit below any hint now)."""
        for hint in self._hints.values():
            hint.forget = True
        self._fair.forget()

    async def claim_round(self, free: int) -> tuple[list[ClaimedJob], bool]:
        """Claim up to `free` jobs across the queues, starting at a random one; `full` if
        some queue may have more."""
        claimed: list[ClaimedJob] = []
        self.in_hand = claimed
        full = False
        now = time.monotonic()
        if now >= self._controls_due:
            await self._read_controls()
        queues = [
            q
            for q in self.settings.queues
            if q not in self.paused and self._room_at.get(q, 0.0) <= now
        ]
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
        if queue not in self.fair or self._rated(queue):
            return await self._claim_plain(queue, want)
        started = time.perf_counter()
        got = await self._fair.claim(queue, want)
        seconds = time.perf_counter() - started
        self._claimed(seconds, got.jobs, got.walked, unhinted=self._fair.from_floor)
        if got.walked == want:
            return got.jobs, True
        jobs, full = await self._claim_plain(queue, want - got.walked)
        if not full and got.top_id is not None:
            self._passed(queue, got.top_id)
        return got.jobs + jobs, full

    def _passed(self, queue: str, position: Position) -> None:
        """The plain claim came back short after a fair claim took the jobs up to `position`:
        every claimable job without a key before it is taken, and those of the fair claim are
        gone from the claim index, so the plain hint moves past them. Otherwise it stays where
        the plain claims last found a job, and while a long transaction keeps the dead entries
        of every fair job claimed since, each plain claim would walk them all again."""
        hint = self._hints[queue]
        if hint.after is not None and position > hint.after:
            hint.after = position

    def _rated(self, queue: str) -> bool:
        """Whether `queue` is claimed with job_claim_rated."""
        return queue in self.rated or (
            queue in self._keyed and bool(self.limited_tasks or self.key_limits)
        )

    def _claimed(self, seconds: float, jobs: list[ClaimedJob], walked: int, unhinted: bool) -> None:
        self.stats.recent_claims.append((seconds, unhinted))
        self.stats.claims += 1
        if unhinted:
            self.stats.unhinted_claims += 1
        self.observers.claimed(seconds, len(jobs))
        self.stats.claimed += len(jobs)
        if walked == 0:
            self.stats.empty_claims += 1
        self.in_hand.extend(jobs)

    async def _claim_plain(self, queue: str, want: int) -> tuple[list[ClaimedJob], bool]:
        hint = self._hints[queue]
        left = hint.after  # where the claims before left it, before a step back or a drop
        self._absorb(hint, self._sweeps.get(queue))
        jobs, walked = await self._claim_urgent(queue, hint, want)
        if walked < want:
            swept, swept_walked = await self._claim_swept(queue, hint, want - walked)
            jobs, walked = jobs + swept, walked + swept_walked
        if walked == want:
            return jobs, True
        after, rest = hint.after, want - walked
        dropped = after is None  # this claim starts from the floor
        start = self._early(queue, hint)
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
        if after is None:
            hint.urgent.clear()  # the floor claim covered them
            self._reset_deadline(hint)
        if main.top is not None:
            # A claim that began early and walked to the end leaves nothing unclaimed before
            # the hint it started with, even where all it found were late jobs.
            short = walked + main.walked < want
            hint.after = max(main.top, after) if start and after and short else main.top
        elif after is None and self._announced:
            # An empty claim from the floor: nothing is claimable anywhere, and whatever
            # becomes claimable from now on is announced. Park the hint past everything, or
            # the next claims would walk from the floor again while the queue stays empty.
            # A steady queue whose snapshot showed no transaction in progress goes back to
            # where it was instead: every job id drawn so far is behind it, so new jobs land
            # after it and the worker stays steady, where a park would ask for every
            # wake-up until a claim finds a job.
            snapshot = main.snapshot
            quiet = queue in self.steady and snapshot is not None and not snapshot.in_progress
            hint.after = hint.before if quiet and hint.before is not None else CEILING
        else:
            hint.after = after
        watch_from = self._watch_from(hint, left, after or FLOOR, main.top)
        hint.unheard = hint.unheard and not dropped
        self._track(queue, hint, after or FLOOR, main, start or after or FLOOR, watch_from)
        jobs += main.jobs
        return jobs, walked + main.walked == want

    def _early(self, queue: str, hint: _QueueHint) -> Position | None:
        """Where a steady queue's claim starts when that is before its hint: where the
        earliest claim that passed a transaction still young (YOUNG_SECONDS) began. Such a
        transaction is most often an enqueue on its way to commit, and starting there finds
        its job at the first claim after the commit, where the rewind would find it one claim
        later. The walk back covers the jobs claimed since, a few in steady mode; a
        transaction open longer is left to the rewind, so one that stays open (the long
        transactions of the MVCC failure) never makes every claim walk back. Nor does a
        claim from the floor: walking back there would repeat its walk over every dead
        entry at each claim while the transaction is young."""
        if queue not in self.steady or hint.after is None or hint.after == CEILING:
            return None
        young = time.monotonic() - YOUNG_SECONDS
        watched = [*hint.watch.values(), *([hint.unnamed[2]] if hint.unnamed else [])]
        starts = [w.at for w in watched if w.since >= young and w.at != FLOOR]
        if not starts or (first := min(starts)) >= hint.after:
            return None
        return first

    def _watch_from(
        self, hint: _QueueHint, left: Position | None, began: Position, top: Position | None
    ) -> Position:
        """Where a claim that began at `began` watches the transactions it could not see
        from, when the claims before it left the hint at `left` and it stepped back from
        there (a rewind, an announced job) or dropped it (a claim from the floor).

        Those already watched keep their older start (_track merges them). A new one took
        its id after the claims that left the hint at `left` had taken their snapshots
        (they watched, or followed as an unnamed range, every transaction then in
        progress), so it drew its job ids after every id they saw: its jobs lie after
        `left` at `left`'s priority and at less urgent ones. A more urgent job of its is
        announced: the rows skip no priority more urgent than the hint's, and while the hint
        is dropped, than where it was (wake_range). The claim's own top priority is taken in
        too, should it be more urgent (the rows then narrow to it). Watched from where the
        claim began instead, each transaction's end would send the next claim back there,
        and it would watch the next ones from there: a claim from the floor, or from an old
        step back, every other claim for as long as a transaction is in progress at each
        (test_steady_wake.py pins the rule). From `began` when there is no `left` (the
        first claim, a hint parked past everything) and after the listener was lost, when
        nothing can be said of the wake-ups."""
        if hint.unheard or left is None or left == CEILING:
            return began
        bound = left if top is None else min(left, (top[0], left[1]))
        return max(began, bound)

    def _track(
        self,
        queue: str,
        hint: _QueueHint,
        began: Position,
        batch: _Batch,
        walked_from: Position,
        watch_from: Position,
    ) -> None:
        """Follow the transactions a claim could not see.

        Every insert into jobs gives its transaction an id before it draws job ids, so a job
        this claim passed unseen (below where the hint now is) belongs to a transaction in
        progress in its snapshot. Each is remembered with where the first claim that passed
        it began, or, for a claim that stepped back or began at the floor, from where the
        hint was left before it (`watch_from`, _watch_from); when a later claim's snapshot
        shows it ended, a steady queue's hint moves back there: that job skipped its
        wake-up. Other queues' jobs announce themselves, but for those seen while the queue
        was steady, whose wake-ups the rows skipped then.

        A snapshot names the transactions in progress only below its xmax (the newest to
        have ended). One newer than that may still own a job the claim passed: its id came
        after the job's of an older transaction, and it drew its job id before that one did.
        The claim's own transaction id, drawn after its snapshot, bounds them; that range is
        followed until a later snapshot names every id in it, and since those that ended
        meanwhile cannot be told apart, the claim after that starts where the range's claim
        began. Not after a claim watching from the floor: each would send the next one to
        the floor."""
        snapshot = batch.snapshot
        if snapshot is None:
            return
        seen = snapshot.in_progress
        steady = queue in self.steady
        backs: list[Position] = []
        if hint.unnamed is not None and snapshot.xmax is not None:
            lo, hi, unnamed = hint.unnamed
            for xid in seen:
                if lo <= xid < hi:  # named now: followed as the others
                    hint.watch[xid] = hint.watch.get(xid, unnamed).merged(unnamed)
            if snapshot.xmax >= hi:
                hint.unnamed = None
                if walked_from > unnamed.at and (steady or unnamed.steady):
                    backs.append(unnamed.at)
        if hint.watch:
            still = set(seen)
            ended = [hint.watch.pop(xid) for xid in list(hint.watch) if xid not in still]
            backs += [w.at for w in ended if steady or w.steady]
        if backs:
            back = min(backs)
            hint.rewind = back if hint.rewind is None else min(hint.rewind, back)
            self.rewinds += 1
        if hint.after != began:  # it moved past what this snapshot could not see
            now = _Seen(watch_from, time.monotonic(), steady)
            for xid in seen:
                hint.watch[xid] = hint.watch.get(xid, now).merged(now)
            named, own = snapshot.xmax, snapshot.xid
            if named is not None and own is not None and own > named and watch_from != FLOOR:
                lo, hi, unnamed = hint.unnamed or (named, own, now)
                hint.unnamed = (min(lo, named), max(hi, own), unnamed.merged(now))

    def _absorb(self, hint: _QueueHint, sweep: Sweep[Position] | None) -> None:
        """Fold the announcements since the last round into the hint, a rewind and a reset
        (the sweep's next slice, or without one a claim from the floor)."""
        expired = hint.after is not None and time.monotonic() >= hint.deadline
        if expired and not hint.forget and sweep is not None:
            sweep.due = True
            self._reset_deadline(hint)
        elif hint.forget or expired:
            self._drop(hint)
            hint.forget = False
            hint.announced.clear()
        if hint.rewind is not None:
            if hint.after is not None and hint.rewind < hint.after:
                if hint.rewind == FLOOR:
                    self._drop(hint)
                else:
                    hint.after = hint.rewind
            hint.rewind = None
        announced, hint.announced = hint.announced, {}
        if hint.after is None:
            return  # the floor claim covers everything announced
        for priority, job_id in announced.items():
            below = (priority, job_id - 1)
            if below >= hint.after:
                continue  # the hint's range covers it
            if priority == hint.after[0] or hint.after == CEILING:
                # A parked hint (nothing was claimable, and everything since is announced)
                # moves to the first job announced: kept parked, it would take every job of
                # a stream as an urgent claim, and could never say which wake-ups to skip.
                hint.after = below
            else:
                hint.urgent[priority] = min(job_id - 1, hint.urgent.get(priority, MAX_ID))

    @staticmethod
    def _drop(hint: _QueueHint) -> None:
        """The next claim starts from the floor. Where the hint was is kept only when it was
        a job's position: an older one would send the claims back over every job since."""
        hint.before = hint.after if hint.after != CEILING else None
        hint.after = None

    async def _claim_urgent(
        self, queue: str, hint: _QueueHint, want: int
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
        self, queue: str, hint: _QueueHint, want: int
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

    async def _claim(self, queue: str, after: Position, before: Position, limit: int) -> _Batch:
        params = ClaimParams(
            queue,
            after,
            before,
            limit,
            self.worker_id,
            limited_tasks=sorted(self.limited_tasks),
            job_limits=bool(self.limited_tasks or self.key_limits),
            start_margin=RATE_START_MARGIN,
        )

        room_in: float | None = None
        back_in: float | None = None
        sent: float | None = None  # when a claim under rate limits (job_claim_rated) was sent

        async def claim(conn: AsyncConn) -> Claimed:
            nonlocal room_in, back_in, sent
            if self._rated(queue):
                for attempt in range(CLAIM_RETRIES):
                    try:
                        sent = time.monotonic()
                        rated, room_in, back_in = await self.store.claim_rated(conn, params)
                        return rated
                    except psycopg.errors.DeadlockDetected:
                        if attempt == CLAIM_RETRIES - 1:
                            raise
            if queue not in self._keyed:
                found = await self.store.claim_unkeyed(conn, params)
                if found is not None:
                    return found
                self._keyed.add(queue)  # for good: keyed (or rated) claims from now on
                if self.limited_tasks or self.key_limits:
                    return await claim(conn)
            for attempt in range(CLAIM_RETRIES):
                try:
                    return await self.store.claim_keyed(conn, params)
                except psycopg.errors.DeadlockDetected:
                    if attempt == CLAIM_RETRIES - 1:
                        raise
            return Claimed([], [])

        started = time.perf_counter()
        claimed = await self.link.run(claim)
        seconds = time.perf_counter() - started
        jobs = claimed.jobs
        if sent is not None and jobs:
            # The claim's time, which the limit counts, is after it was sent.
            start_by = sent + RATE_START_MARGIN.total_seconds()
            jobs = [dataclasses.replace(job, start_by=start_by) for job in jobs]
        jobs.sort(key=lambda j: (j.priority, j.id))
        self._claimed(seconds, jobs, claimed.walked, unhinted=after == FLOOR)
        throttled = room_in is not None and room_in > 0 and claimed.walked < limit
        if throttled:
            self._room_at[queue] = time.monotonic() + float(room_in or 0.0)
        else:
            self._room_at.pop(queue, None)
        if back_in is not None:  # jobs put back by their task's or key's limit: due then
            due = time.monotonic() + max(back_in, 0.0)
            self._next_due = due if self._next_due is None else min(self._next_due, due)
        return _Batch(jobs, claimed.walked, claimed.top, throttled, claimed.snapshot)

    def _reset_deadline(self, hint: _QueueHint) -> None:
        s = self.settings
        spread = self._rng.uniform(1 - s.hint_reset_jitter, 1 + s.hint_reset_jitter)
        hint.deadline = time.monotonic() + s.hint_reset_interval.total_seconds() * spread

    def promotion_due(self, now: float) -> bool:
        return now >= self._next_promote or (self._next_due is not None and now >= self._next_due)

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

    def next_wake(self) -> float:
        """The monotonic time of the next promotion this worker must do, or of the next room
        in a full rate-limited queue, whichever is first."""
        now = time.monotonic()
        # A room time already past is the fetch loop's to act on (room_due), not a wake-up:
        # with every slot busy it would wake the loop again and again until one frees.
        times = [self._next_promote, *(at for at in self._room_at.values() if at > now)]
        if self._next_due is not None:
            times.append(self._next_due)
        return min(times)
