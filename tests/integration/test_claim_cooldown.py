"""The claim cooldown: while jobs keep arriving a worker claims at most once per cooldown,
so they share a claim; after a quiet spell or a full claim it claims at once.

The cooldown here is half a second, far longer than the default, so that what is held back
and what is not differ by far more than a loaded machine's scheduling noise. The poll is a
minute away: every job that runs in time was started by a wake-up or a claim after a full one.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import psycopg

from pgqueue import Queue, Worker
from tests.conftest import wait_until, worker_in_thread

COOLDOWN = 0.5


def _starts(queue: Queue) -> tuple[list[tuple[str, float]], threading.Condition]:
    started: list[tuple[str, float]] = []
    changed = threading.Condition()

    @queue.task(name="t")
    def t(label: str) -> None:
        with changed:
            started.append((label, time.monotonic()))
            changed.notify_all()

    return started, changed


def _enqueue(queue: Queue, conn: psycopg.Connection[object], *labels: str) -> float:
    for label in labels:
        queue.enqueue("t", {"label": label}, conn=conn)
    conn.commit()
    return time.monotonic()


def _count_is(started: list[tuple[str, float]], n: int) -> Callable[[], bool]:
    return lambda: len(started) == n


def _idle(worker: Worker) -> None:
    wait_until(lambda: worker.stats.claims > 0, what="the worker's first (empty) claim")
    time.sleep(COOLDOWN * 1.5)  # a quiet spell longer than the cooldown


def test_a_claim_after_a_quiet_spell_is_not_held_back(queue: Queue, dsn: str) -> None:
    started, changed = _starts(queue)
    worker = Worker(queue, dsn=dsn, poll_interval=60, claim_cooldown=COOLDOWN)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        _idle(worker)
        committed = _enqueue(queue, conn, "a")
        with changed:
            assert changed.wait_for(lambda: len(started) == 1, timeout=20)
        assert started[0][1] - committed < COOLDOWN * 0.6, "the first job waited a cooldown"


def test_jobs_arriving_within_the_cooldown_wait_for_it_and_none_is_lost(
    queue: Queue, dsn: str
) -> None:
    started, changed = _starts(queue)
    worker = Worker(queue, dsn=dsn, poll_interval=60, claim_cooldown=COOLDOWN)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        _idle(worker)
        _enqueue(queue, conn, "a")
        with changed:
            assert changed.wait_for(lambda: len(started) == 1, timeout=20)
        # Each in its own transaction, as many web requests would: every one notifies.
        _enqueue(queue, conn, "b")
        _enqueue(queue, conn, "c")
        with changed:
            # Their wake-ups came during the cooldown; the poll is a minute away.
            assert changed.wait_for(lambda: len(started) == 3, timeout=20)
        first = started[0][1]
        later = {label: at - first for label, at in started[1:]}
        assert sorted(later) == ["b", "c"]
        # The claim that took "a" began before "a" started, so the next could not begin
        # until a cooldown after that; both came in it.
        assert min(later.values()) >= COOLDOWN * 0.9, later
        assert max(later.values()) - min(later.values()) < COOLDOWN * 0.5, later


def test_a_full_claim_is_followed_at_once_not_after_a_cooldown(queue: Queue, dsn: str) -> None:
    started, changed = _starts(queue)
    # One slot: every claim that finds a job is full, so none is held back.
    worker = Worker(queue, dsn=dsn, poll_interval=60, claim_cooldown=COOLDOWN, concurrency=1)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        _idle(worker)
        labels = [str(n) for n in range(6)]
        _enqueue(queue, conn, *labels)
        with changed:
            assert changed.wait_for(lambda: len(started) == len(labels), timeout=20)
        at = [when for _, when in started]
        gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
        # Six jobs held back a cooldown each would take 2.5 s at least.
        assert at[-1] - at[0] < COOLDOWN * 2, gaps


def test_a_cooldown_of_zero_claims_on_every_wake_up(queue: Queue, dsn: str) -> None:
    started, changed = _starts(queue)
    worker = Worker(queue, dsn=dsn, poll_interval=60, claim_cooldown=0)
    with worker_in_thread(worker), psycopg.connect(dsn) as conn:
        _idle(worker)
        for n in range(1, 6):
            committed = _enqueue(queue, conn, str(n))
            with changed:
                assert changed.wait_for(_count_is(started, n), timeout=20)
            assert started[-1][1] - committed < COOLDOWN * 0.6
