"""What a rescuer makes of its looks at workers' recorded sessions (pgqueue/worker/rescuer.py):
a worker is dead once its session was gone at every look for the grace, the same session."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pgqueue.store.workers import GoneSession
from pgqueue.worker.rescuer import GoneSessions

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
GRACE = timedelta(seconds=2)


def _seen(worker: int, session: int, at: float, pid: int = 4242) -> GoneSession:
    return GoneSession(worker, pid, T0 + timedelta(seconds=session), T0 + timedelta(seconds=at))


def test_a_session_gone_at_every_look_for_the_grace_is_a_dead_worker() -> None:
    gone = GoneSessions(GRACE)
    assert gone.dead([_seen(7, 0, 10.0)]) == []
    assert gone.dead([_seen(7, 0, 11.0)]) == []
    assert gone.dead([_seen(7, 0, 12.0), _seen(8, 0, 12.0)]) == [_seen(7, 0, 12.0)]
    assert gone.suspects == {7, 8}


def test_a_look_that_finds_the_session_starts_the_count_again() -> None:
    gone = GoneSessions(GRACE)
    gone.dead([_seen(7, 0, 10.0)])
    assert gone.dead([]) == [] and gone.suspects == set()
    assert gone.dead([_seen(7, 0, 12.5)]) == []
    assert gone.dead([_seen(7, 0, 14.5)]) == [_seen(7, 0, 14.5)]


def test_a_new_session_recorded_between_looks_starts_the_count_again() -> None:
    """The worker recorded a new session and lost it too: its new session gets the grace."""
    gone = GoneSessions(GRACE)
    gone.dead([_seen(7, 0, 10.0)])
    assert gone.dead([_seen(7, 11, 12.0)]) == []
    assert gone.dead([_seen(7, 11, 14.0)]) == [_seen(7, 11, 14.0)]


def test_a_session_with_a_new_pid_and_the_same_start_is_a_new_session() -> None:
    gone = GoneSessions(GRACE)
    gone.dead([_seen(7, 0, 10.0, pid=1)])
    assert gone.dead([_seen(7, 0, 12.0, pid=2)]) == []
    assert gone.dead([_seen(7, 0, 14.0, pid=2)]) == [_seen(7, 0, 14.0, pid=2)]


def test_the_next_look_is_due_when_the_first_suspects_grace_ends() -> None:
    gone = GoneSessions(GRACE)
    assert gone.due_in() is None
    gone.dead([_seen(7, 0, 10.0)])
    assert gone.due_in() == GRACE
    gone.dead([_seen(7, 0, 11.5), _seen(8, 0, 11.5)])
    assert gone.due_in() == timedelta(seconds=0.5)
    gone.dead([_seen(8, 0, 12.0)])
    assert gone.due_in() == timedelta(seconds=1.5)
    gone.dead([])
    assert gone.due_in() is None
