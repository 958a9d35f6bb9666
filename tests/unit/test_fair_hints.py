"""Where a worker's fair claims start (pgqueue/worker/fair.py): each claim starts where the
claims before the last one had reached, so that a job a claim committing meanwhile passed
is still reached, and an empty claim moves that start on like any other."""

from __future__ import annotations

from pgqueue.worker.fair import _FairHint

Position = tuple[int, float] | None


def start(hint: _FairHint) -> Position:
    """Where the hint's next claim starts (None: the floor)."""
    return hint.after


def test_each_claim_starts_where_the_claims_before_the_last_one_reached() -> None:
    hint = _FairHint()
    assert start(hint) is None  # the first claim starts at the floor
    hint.moved((0, 5.0))
    assert start(hint) is None  # the second too: the first may not have committed yet
    hint.moved((0, 9.0))
    assert start(hint) == (0, 5.0)
    hint.moved((0, 7.0))  # a claim that reached less does not move the reach back
    assert (start(hint), hint.reached) == ((0, 9.0), (0, 9.0))


def test_an_empty_claim_moves_the_start_on_so_the_next_does_not_walk_from_the_floor() -> None:
    """After a reset, a claim that found jobs and then one that found none: the third starts
    where the first reached. Before, it started at the floor again, and every empty claim
    after it, each walking the dead entries a long transaction keeps there."""
    hint = _FairHint()
    hint.moved((0, 5.0))
    hint.moved(None)
    assert start(hint) == (0, 5.0)
    hint.moved(None)
    assert (start(hint), hint.reached) == ((0, 5.0), (0, 5.0))


def test_a_reset_starts_at_the_floor_and_empty_claims_stay_there_until_one_finds_jobs() -> None:
    hint = _FairHint()
    hint.moved((0, 5.0))
    hint.moved((0, 6.0))
    hint.forget()
    hint.moved(None)
    assert start(hint) is None  # nothing reached since the reset: the floor still
    hint.moved((0, 8.0))
    hint.moved(None)
    assert start(hint) == (0, 8.0)
