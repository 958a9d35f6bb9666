"""The fetch loop: claim as many jobs as there are free slots, run them, sleep until more may
be claimable.

Owns: the cadence of claims: what the loop knows of the work waiting (whether more may be
claimable, the wake-ups heard, when a claim last came back short, its pace (pace.py:
whether the recent claims make the worker steady), whether burst mode has claimed from the
floor since work was found); the atomic lanes' tasks; and the way out at a stop: the
grace running jobs and lanes get, then their cancellation. The jobs it claims run in flight
(inflight.py), which puts back what the stop left unfinished.

Invariants:
- A wake-up heard while a claim runs makes the loop claim again: it may name a job the claim
  did not see (test_wakeup.py).
- With every slot busy the loop sleeps until one frees, never spinning on a poll time already
  past; a finished job wakes it.
- A claim that follows a short one by less than the claim_cooldown setting waits out the
  rest, so wake-ups arriving faster than that share one claim; a claim after a quiet spell or
  after a full one (a backlog) runs at once. Wake-ups heard during the wait are not lost: the
  claim that follows it sees their jobs.
- Steady mode (pace.py): while the recent claims found a job or more per cooldown,
  the loop claims every cooldown without waiting for a wake-up, and asks not to be woken for
  new jobs (interest.py); it leaves when a window it spent claiming found less than half a
  job per cooldown, and asks for them again. Either ask is made as soon as the mode changes,
  before the next claim, not only before a sleep. Not with a cooldown of 0, nor
  quiet_after=None.
- In burst mode the run ends only when nothing runs and a claim from the floor came back
  empty: a wake-up naming a job below a hint may still be on its way.

It reacts to events (events.py): every kind that says jobs may be claimable makes it claim
again (a pause notice only when the pause is lifted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from pgqueue.models import WorkerSettings
from pgqueue.store.jobs import JobsStore
from pgqueue.store.plan import AsyncConn
from pgqueue.worker.atomic import AtomicLane
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.completer import Completer
from pgqueue.worker.events import (
    Bus,
    ControlsChanged,
    JobsAnnounced,
    JobsClaimable,
    PauseChanged,
    Relistened,
    WorkerRevived,
)
from pgqueue.worker.inflight import InFlight
from pgqueue.worker.interest import Skip, WakeInterest
from pgqueue.worker.pace import Pace

log = logging.getLogger("pgqueue.worker")


class Stop:
    """How a run is asked to end: `requested` by stop() or a signal, then `forced` by a second
    one (or stop(force=True)), which cuts the running jobs' grace short."""

    def __init__(self) -> None:
        self.requested = False
        self.forced = False
        self.forced_event = asyncio.Event()

    def request(self, force: bool) -> None:
        self.requested = True
        if force:
            self.forced = True
            self.forced_event.set()


class FetchLoop:
    def __init__(
        self,
        *,
        settings: WorkerSettings,
        worker_id: int,
        jobs: JobsStore,
        claimer: Claimer,
        interest: WakeInterest | None,
        completer: Completer,
        inflight: InFlight,
        events: Bus,
        stop: Stop,
    ) -> None:
        """Starts what it claims in `inflight`; subscribes to `events` at once."""
        self.settings = settings
        self.worker_id = worker_id
        self.jobs = jobs
        self.claimer = claimer
        self.interest = interest
        self.completer = completer
        self.inflight = inflight
        self.stop = stop
        self.running = inflight.running  # read at every turn: the same dict
        self.wakes = 0  # wake-ups so far: one during a claim means claim again
        self.atomic_lanes: list[AtomicLane] = []
        self._atomic_tasks: list[asyncio.Task[None]] = []  # one running each of atomic_lanes
        self._maybe_more = True
        self._retried_seen = 0
        self._floor_checked = False  # burst mode: an empty claim from the floor since work
        self._short_at = time.monotonic()  # when a claim round last found less than it asked
        self._claimed_at = -1e9  # when the last claim round began, if it came back short
        # Whether the worker claims every claim_cooldown instead of being woken for each new
        # job (steady mode), judged only where it can ask not to be woken.
        self.pace = Pace(
            interest is not None
            and settings.claim_cooldown.total_seconds() > 0
            and settings.quiet_after is not None
        )
        self._wake = inflight.ended  # a job ending wakes the loop too
        self._atomic_wake = asyncio.Event()
        self._subscribe(events)

    def _subscribe(self, events: Bus) -> None:
        for kind in (JobsAnnounced, Relistened, ControlsChanged, WorkerRevived, JobsClaimable):
            events.subscribe(kind, lambda e: self.notified())
        events.subscribe(PauseChanged, lambda e: None if e.paused else self.notified())

    def start_atomic(self, lanes: list[AtomicLane]) -> None:
        """Run `lanes` until the stop; they are drained with the jobs at the end."""
        self.atomic_lanes = lanes
        self._atomic_tasks = [
            asyncio.create_task(lane.run(), name=f"pgqueue-atomic-{n}")
            for n, lane in enumerate(lanes)
        ]

    # -- claiming ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Claim and start jobs until the stop (or, in burst mode, until there are none)."""
        s = self.settings
        poll = s.poll_interval.total_seconds()
        cooldown = s.claim_cooldown.total_seconds()
        next_poll = 0.0
        while not self.stop.requested:
            free = s.concurrency - len(self.running)
            now = time.monotonic()
            if now >= next_poll or self.claimer.controls.room_due(now):
                self._maybe_more = True
            if self.pace.steady and now >= self.pace.claim_at:
                self._maybe_more = True  # nobody announces new jobs to a steady worker
            if self.claimer.promotion_due(now) and await self.claimer.promote():
                self._maybe_more = True
            full = False
            if free > 0 and self._maybe_more:
                if (rest := self._claimed_at + cooldown - now) > 0:
                    # Work is arriving faster than the cooldown: let it gather. A plain sleep,
                    # as a wake-up must not cut it short; those heard meanwhile are covered by
                    # the claim below, which begins after them.
                    await asyncio.sleep(rest)
                    if self.stop.requested:
                        break
                    free = s.concurrency - len(self.running)
                wakes = self.wakes
                began = time.monotonic()
                jobs, full = await self.claimer.claim_round(free)
                if jobs:
                    self._floor_checked = False
                for job in jobs:
                    self.inflight.start(job)
                # A wake-up that arrived while the claim ran may be for a job it did not see.
                self._maybe_more = full or self.wakes != wakes
                next_poll = time.monotonic() + poll
                if not full:
                    self._short_at = time.monotonic()
                self._claimed_at = -1e9 if full else began
                self.pace.judge(began, len(jobs), full, cooldown, bool(self.claimer.hints.steady))
            elif now >= next_poll:
                # Every slot is busy: the poll is made when one frees (a job ending wakes the
                # loop), and sleeping until a poll time already past would spin.
                next_poll = now + poll
            if s.burst and not full and not self.running and await self._burst_done():
                break
            if self._maybe_more and len(self.running) < s.concurrency:
                # Entering or leaving steady mode is written before the next claim (once the
                # claimer can say which wake-ups it may skip): while every new job still
                # wakes the worker, each wake-up sends the loop back to claim, and it would
                # not reach the ask made before sleeping for as long as the stream lasts.
                if (
                    self.interest is not None
                    and self.pace.steady != bool(self.claimer.hints.steady)
                    and await self._ask()
                ):
                    self._maybe_more = True
                continue
            if self.interest is not None and await self._ask_for_wakes():
                continue
            wake_at = min(next_poll, self.claimer.next_wake())
            if self.interest is not None and (check := self.interest.next_check()) is not None:
                wake_at = min(wake_at, check)
            if self.pace.steady and len(self.running) < s.concurrency:
                wake_at = min(wake_at, self.pace.claim_at)
            await self._sleep(wake_at - time.monotonic())

    async def _ask_for_wakes(self) -> bool:
        """Before sleeping: ask for the wake-ups this worker needs (interest.py); True when
        it should claim first. Idle atomic lanes do not keep a busy worker asking: they poll,
        so an atomic job waits at most a poll interval for one while every slot is busy."""
        assert self.interest is not None
        s = self.settings
        await asyncio.sleep(0)  # the jobs just started run their first step before this
        if self._maybe_more and len(self.running) < s.concurrency:
            return True  # a job ended meanwhile: claim now, as the loop would have
        settled = await self.interest.settle()
        widened = await self._ask()
        if settled or widened:
            self._maybe_more = True
        return (settled or widened) and len(self.running) < s.concurrency

    async def _ask(self) -> bool:
        """Write the wake-ups this worker wants now (interest.py); True when it asked for
        more (a widening)."""
        assert self.interest is not None
        s = self.settings
        # More may be claimable and every slot was busy when the loop came here: the worker
        # claims as soon as one frees, so it is busy, not waiting, even if a job has ended
        # since (test_hint.py's control caught a worker that widened then).
        busy = (
            s.quiet_after is not None
            and self._maybe_more
            and time.monotonic() - self._short_at >= s.quiet_after.total_seconds()
        )
        skip: dict[str, Skip | None] = {}
        steady: set[str] = set()
        for queue in s.queues:
            found = self.claimer.wake_range(queue) if busy or self.pace.steady else None
            skip[queue] = None
            if found is not None and busy:
                skip[queue] = (*found, False)
            elif found is not None and self.claimer.steady_eligible(queue):
                skip[queue] = (*found, True)
                steady.add(queue)
        # Rewinds are armed before the rows that make them needed are written.
        self.claimer.hints.steady = steady
        return await self.interest.ask(skip)

    async def _burst_done(self) -> bool:
        """In burst mode: nothing running, nothing claimable, nothing due to promote.

        "Nothing claimable" is only believed after a claim from the floor came back empty:
        a wake-up naming a job below the hint may still be on its way."""
        if self.running or not all(lane.idle for lane in self.atomic_lanes):
            return False
        await self.completer.flushed()
        retried_before, self._retried_seen = self._retried_seen, self.completer.retried
        promoted = await self.claimer.promote()
        if self._retried_seen != retried_before or promoted or not self._floor_checked:
            # Retried or promoted jobs sit below the hints: look from the floor.
            self._floor_checked = True
            self.claimer.forget_hints()
            self._maybe_more = True
            return False
        return True

    # -- waking -----------------------------------------------------------------------------

    def notified(self) -> None:
        """Jobs may be claimable: claim again, and wake the loop and the idle atomic lanes."""
        self.wakes += 1
        self._maybe_more = True
        self._atomic_wake.set()
        self._wake.set()

    def wake(self) -> None:
        """Wake the loop to look again (at a stop)."""
        self._wake.set()

    async def atomic_idle(self) -> None:
        """An atomic lane found nothing: wait for a notification or the next poll."""
        if not self._atomic_wake.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._atomic_wake.wait(), self.settings.poll_interval.total_seconds()
                )
        self._atomic_wake.clear()

    async def _sleep(self, timeout: float) -> None:
        if timeout > 0 and not self._wake.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    # -- stopping ---------------------------------------------------------------------------

    async def drain(self) -> None:
        """Give running jobs and atomic lanes the grace period, then cancel what is left:
        lease jobs are put back (inflight.py), atomic jobs roll back."""
        lanes = self._atomic_tasks
        self._atomic_wake.set()  # idle lanes see the stop at once
        if (self.running or lanes) and not self.stop.forced:
            forced = asyncio.create_task(self.stop.forced_event.wait())
            deadline = time.monotonic() + self.settings.shutdown_grace.total_seconds()
            while (self.running or any(not lane.done() for lane in lanes)) and not (
                self.stop.forced
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    [*self.running.values(), *(lane for lane in lanes if not lane.done()), forced],
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            forced.cancel()
        leftover = [*self.running.values(), *(lane for lane in lanes if not lane.done())]
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        self.inflight.stopped()

    async def release_orphans(self, conn: AsyncConn) -> None:
        """Put back jobs a claim took for us but whose reply the broken connection lost (the
        claim link calls this when it reconnects)."""
        known = list(self.running) + self.completer.job_ids()
        known += [job.id for job in self.claimer.in_hand]  # claimed this round, not yet started
        orphans = await self.jobs.release_orphans(conn, self.worker_id, known)
        if orphans:
            log.warning("put back %d jobs claimed while the connection broke", len(orphans))
            self.claimer.forget_hints()  # they sit below any hint now
            self.notified()  # and nobody else was told they are back
