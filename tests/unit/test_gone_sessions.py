"""What a rescuer makes of its looks at workers' session locks (pgqueue/worker/rescuer.py):
a worker is dead once its lock was free at every look for the grace, under one session."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pgqueue.store.workers import GoneSession
from pgqueue.worker.rescuer import GoneSessions

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
GRACE = timedelta(seconds=2)


def _seen(worker: int, session: int, at: float) -> GoneSession:
    return GoneSession(worker, T0 + timedelta(seconds=session), T0 + timedelta(seconds=at))


def test_a_lock_free_at_every_look_for_the_grace_is_a_dead_worker() -> None:
    gone = GoneSessions(GRACE)
    assert gone.dead([_seen(7, 0, 10.0)]) == []
    assert gone.dead([_seen(7, 0, 11.0)]) == []
    assert gone.dead([_seen(7, 0, 12.0), _seen(8, 0, 12.0)]) == [_seen(7, 0, 12.0)]
    assert gone.suspects == {7, 8}


def test_a_look_that_finds_the_lock_held_starts_the_count_again() -> None:
    gone = GoneSessions(GRACE)
    gone.dead([_seen(7, 0, 10.0)])
    assert gone.dead([]) == [] and gone.suspects == set()
    assert gone.dead([_seen(7, 0, 12.5)]) == []
    assert gone.dead([_seen(7, 0, 14.5)]) == [_seen(7, 0, 14.5)]


def test_a_new_session_recorded_between_looks_starts_the_count_again() -> None:
    """The worker took its lock back and lost it again: its new session gets the grace."""
    gone = GoneSessions(GRACE)
    gone.dead([_seen(7, 0, 10.0)])
    assert gone.dead([_seen(7, 11, 12.0)]) == []
    assert gone.dead([_seen(7, 11, 14.0)]) == [_seen(7, 11, 14.0)]
