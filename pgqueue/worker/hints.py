"""Where each queue's claims start: the hints, and what moves them.

Owns: per queue, the position after which its next plain claim starts, the more urgent
ranges announced below it, the transactions its claims could not see, and when its safety
net is next due. Runs no statement: the claimer (claimer.py) asks it where to claim and tells
it what each claim found.

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
  - a forgotten hint (forget), once per event. The listener lost: the wake-ups sent
    meanwhile are gone, so a job may have come back below the hint anywhere, and it runs at
    the first claim after, where a sweep would find it only within a cycle (about a third of
    a long transaction's age). A queue resumed: no claim of it ran while it was paused, so
    the transactions its claims would have followed were not, and its resume may be learnt
    from the table, not heard; a start after the pause that keeps every job found at once
    is not shown here, so the resume still claims from the floor;
  - polling without a listener, after every short hinted claim: nothing announces a job
    that comes back below the hint (a retry, a promotion by another worker, a late commit),
    and it must run at the next poll. A worker that may face long transactions listens;
  - a busy worker's widening (interest.py): its rows skipped the wake-ups of jobs that came
    back too, which no claim follows. A steady queue's widening keeps its hint (widen).
- A queue in `steady` (its rows skip new jobs' wake-ups, loop.py) hears of no new job, late
  commits included. Every unkeyed claim names the transactions in progress in its snapshot;
  those in progress when a claim moved the hint are watched, and once one has ended the next
  claim starts from where that claim began (sql/migrations/0035_steady_wake.sql says why that
  finds every such job; test_steady_wake.py). Not in the same round: the worker's own
  transactions and every other writer show up there too, and a claim more per round cost
  more than the cooldown's wait. While such a transaction is young, each claim starts
  where it was passed instead (early), so its job is found by the first claim after its
  commit.
- A claim that stepped back (a rewind, an announced job) or started from the floor watches
  the transactions new to its snapshot from where the claims before it left the hint (or
  from its own top priority at that id, if more urgent), not from where it began: such a
  transaction drew its job ids after every id those claims saw, and while the hint is
  dropped the rows skip no priority more urgent than where it was (wake_range), so a more
  urgent job of its is announced. Otherwise each claim from the floor, or from an old
  rewind, would send the next one back there for as long as a transaction is in progress
  at each, and under a long transaction each walks every dead entry since (watch_from).
  From the floor still for the first claim, after a hint parked past everything, and
  after the listener was lost.

Fails: never; it only keeps positions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import NamedTuple

from pgqueue.models import WorkerSettings
from pgqueue.store.jobs import ClaimSnapshot
from pgqueue.wakeup import Position
from pgqueue.worker.sweep import Sweep

FLOOR: Position = (-32768, 0)  # below every (priority, id): an unhinted claim
MAX_ID = 2**63 - 1
CEILING: Position = (32767, MAX_ID)  # above every (priority, id)
# How long a transaction a steady claim passed unseen is taken for an enqueue about to commit
# (early): longer than a commit waits for its WAL flush on a busy server, short enough that
# walking back to it covers only the jobs a steady worker claims meanwhile.
YOUNG_SECONDS = 0.02


class Seen(NamedTuple):
    """A transaction (or a range of them) a claim passed unseen: where the first such claim
    began, when (monotonic), and whether the queue was steady then."""

    at: Position
    since: float
    steady: bool

    def merged(self, other: Seen) -> Seen:
        """Seen again: from the earlier position, since the first time, steady if ever."""
        return Seen(min(self.at, other.at), self.since, self.steady or other.steady)


@dataclass
class QueueHint:
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
    watch: dict[int, Seen] = field(default_factory=dict)
    rewind: Position | None = None  # the next claim starts here if `after` is past it
    # Where `after` was when it was last dropped for a claim from the floor.
    before: Position | None = None
    # Wake-ups may have been missed (the listener was lost): the next claim from the floor
    # watches what it could not see from the floor, not from `before` (watch_from).
    unheard: bool = False
    # Transaction ids that a claim which moved `after` could not name (its snapshot names
    # none from its xmax on, up to the claim's own id): one of them may own a job it passed.
    # Kept as a watch entry is, until a claim's snapshot names every id in the range.
    unnamed: tuple[int, int, Seen] | None = None


class Hints:
    """Every queue's hint, for one worker."""

    def __init__(self, settings: WorkerSettings, *, listening: bool = True) -> None:
        self.settings = settings
        self.announced = listening  # wake-ups say where jobs appear only when one listens
        self.queues = {q: QueueHint() for q in settings.queues}
        # Queues whose wake-up rows skip new jobs while the worker is steady (loop.py): a
        # watched transaction's end moves their hint back (track).
        self.steady: set[str] = set()
        self.rewinds = 0
        self._rng = random.Random()

    def __getitem__(self, queue: str) -> QueueHint:
        return self.queues[queue]

    def announce(self, queue: str, position: Position | None) -> None:
        """A wake-up: jobs became claimable in `queue` at `position` or after it (None: where
        is not known, so the next claim starts from the floor)."""
        hint = self.queues.get(queue)
        if hint is None:
            return
        if position is None:
            hint.forget = True
            return
        priority, job_id = position
        hint.announced[priority] = min(job_id, hint.announced.get(priority, MAX_ID))

    def forget(self) -> None:
        """Claim every queue from the floor next time (jobs may sit below any hint now)."""
        for hint in self.queues.values():
            hint.forget = True

    def unheard(self) -> None:
        """Wake-ups were missed (the listener was lost): the next claims from the floor watch
        what they could not see from the floor."""
        for hint in self.queues.values():
            hint.unheard = True

    def wake_range(self, queue: str) -> tuple[int, int] | None:
        """While every slot is busy: the priorities whose new jobs in `queue` the next claim
        finds without a wake-up (it starts from the floor, at the hint, or in an announced
        range); None when it may find none of them (a hint parked past everything)."""
        hint = self.queues[queue]
        if hint.forget or hint.after is None:
            # A claim from the floor is next: it finds every job committed by then, and what
            # it cannot see is watched from where the hint was (watch_from), so a new job
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

    def passed(self, queue: str, position: Position) -> None:
        """The plain claim came back short after a fair claim took the jobs up to `position`:
        every claimable job without a key before it is taken, and those of the fair claim are
        gone from the claim index, so the plain hint moves past them. Otherwise it stays where
        the plain claims last found a job, and while a long transaction keeps the dead entries
        of every fair job claimed since, each plain claim would walk them all again."""
        hint = self.queues[queue]
        if hint.after is not None and position > hint.after:
            hint.after = position

    def claimed(
        self,
        queue: str,
        hint: QueueHint,
        left: Position | None,
        after: Position | None,
        start: Position | None,
        top: Position | None,
        snapshot: ClaimSnapshot | None,
        short: bool,
    ) -> None:
        """Move the hint after a claim: it began at `after` (None: the floor), or at `start`
        before it (early), when the claims before it had left the hint at `left`; it walked
        up to `top`, short of what it was asked for if `short`, and `snapshot` is what it
        could not see."""
        if after is None:
            hint.urgent.clear()  # the floor claim covered them
            self.reset_deadline(hint)
        if top is not None:
            # A claim that began early and walked to the end leaves nothing unclaimed before
            # the hint it started with, even where all it found were late jobs.
            hint.after = max(top, after) if start and after and short else top
        elif after is None and self.announced:
            # An empty claim from the floor: nothing is claimable anywhere, and whatever
            # becomes claimable from now on is announced. Park the hint past everything, or
            # the next claims would walk from the floor again while the queue stays empty.
            # A steady queue whose snapshot showed no transaction in progress goes back to
            # where it was instead: every job id drawn so far is behind it, so new jobs land
            # after it and the worker stays steady, where a park would ask for every
            # wake-up until a claim finds a job.
            quiet = queue in self.steady and snapshot is not None and not snapshot.in_progress
            hint.after = hint.before if quiet and hint.before is not None else CEILING
        else:
            hint.after = after
        since = watch_from(hint, left, after or FLOOR, top)
        self.track(queue, hint, after or FLOOR, snapshot, start or after or FLOOR, since)

    def early(self, queue: str, hint: QueueHint) -> Position | None:
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

    def track(
        self,
        queue: str,
        hint: QueueHint,
        began: Position,
        snapshot: ClaimSnapshot | None,
        walked_from: Position,
        watch_from: Position,
    ) -> None:
        """Follow the transactions a claim could not see.

        Every insert into jobs gives its transaction an id before it draws job ids, so a job
        this claim passed unseen (below where the hint now is) belongs to a transaction in
        progress in its snapshot. Each is remembered with where the first claim that passed
        it began, or, for a claim that stepped back or began at the floor, from where the
        hint was left before it (`watch_from`, watch_from); when a later claim's snapshot
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
            self._rewind(hint, min(backs))
        if hint.after != began:  # it moved past what this snapshot could not see
            now = Seen(watch_from, time.monotonic(), steady)
            for xid in seen:
                hint.watch[xid] = hint.watch.get(xid, now).merged(now)
            named, own = snapshot.xmax, snapshot.xid
            if named is not None and own is not None and own > named and watch_from != FLOOR:
                lo, hi, unnamed = hint.unnamed or (named, own, now)
                hint.unnamed = (min(lo, named), max(hi, own), unnamed.merged(now))

    def widen(self, queue: str, in_progress: Collection[int]) -> bool:
        """A steady queue's rows ask again for new jobs' wake-ups (interest.py). Its claims
        followed what they could not see, so the hint is kept: a transaction in progress now
        may have read the rows before and commit its job after the hint, so it is watched
        from there; one watched that has ended, and a range not yet named, send the next
        claim back now (track's rule: that claim may be the last for a while). False when
        there is no job's position to keep (a claim from the floor is next, the hint is
        parked, or wake-ups were lost): the caller forgets the hint."""
        hint = self.queues[queue]
        if hint.forget or hint.unheard or hint.after is None or hint.after == CEILING:
            return False
        self.ended(queue, [xid for xid in hint.watch if xid not in in_progress])
        if hint.unnamed is not None:
            self._rewind(hint, hint.unnamed[2].at)
        now = Seen(hint.after, time.monotonic(), True)
        for xid in in_progress:
            hint.watch[xid] = hint.watch.get(xid, now).merged(now)
        return True

    def ended(self, queue: str, xids: Collection[int]) -> None:
        """Watched transactions ended: those seen steady send the next claim back (track)."""
        hint = self.queues[queue]
        gone = [hint.watch.pop(xid) for xid in xids if xid in hint.watch]
        backs = [w.at for w in gone if w.steady]
        if backs:
            self._rewind(hint, min(backs))

    def _rewind(self, hint: QueueHint, back: Position) -> None:
        hint.rewind = back if hint.rewind is None else min(hint.rewind, back)
        self.rewinds += 1

    def absorb(self, hint: QueueHint, sweep: Sweep[Position] | None) -> None:
        """Fold the announcements since the last round into the hint, a rewind and a reset
        (the sweep's next slice, or without one a claim from the floor)."""
        expired = hint.after is not None and time.monotonic() >= hint.deadline
        if expired and not hint.forget and sweep is not None:
            sweep.due = True
            self.reset_deadline(hint)
        elif hint.forget or expired:
            drop(hint)
            hint.forget = False
            hint.announced.clear()
        if hint.rewind is not None:
            if hint.after is not None and hint.rewind < hint.after:
                if hint.rewind == FLOOR:
                    drop(hint)
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

    def reset_deadline(self, hint: QueueHint) -> None:
        s = self.settings
        spread = self._rng.uniform(1 - s.hint_reset_jitter, 1 + s.hint_reset_jitter)
        hint.deadline = time.monotonic() + s.hint_reset_interval.total_seconds() * spread


def watch_from(
    hint: QueueHint, left: Position | None, began: Position, top: Position | None
) -> Position:
    """Where a claim that began at `began` watches the transactions it could not see
    from, when the claims before it left the hint at `left` and it stepped back from
    there (a rewind, an announced job) or dropped it (a claim from the floor).

    Those already watched keep their older start (track merges them). A new one took
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


def drop(hint: QueueHint) -> None:
    """The next claim starts from the floor. Where the hint was is kept only when it was
    a job's position: an older one would send the claims back over every job since."""
    hint.before = hint.after if hint.after != CEILING else None
    hint.after = None
