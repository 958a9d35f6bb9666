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


def test_an_empty_claim_from_the_floor_after_a_reset_resumes_where_the_claims_had_reached() -> None:
    """A worker that loses every race for a shallow queue finds nothing from the floor, over
    and over; each such claim walked the dead entries there. The floor claim that found
    nothing has done the reset's work, and the claims before it all committed."""
    hint = _FairHint()
    hint.moved(None, from_floor=True)
    assert start(hint) is None  # a new hint: nothing reached yet, the floor still
    hint.moved((0, 5.0), from_floor=True)
    hint.moved((0, 6.0), from_floor=True)
    hint.forget()
    assert start(hint) is None  # the reset: the next claim starts at the floor
    hint.moved(None, from_floor=True)
    assert (start(hint), hint.reached) == ((0, 6.0), (0, 6.0))
    hint.forget()
    hint.moved((0, 8.0), from_floor=True)  # a floor claim that finds jobs: the usual rule
    assert start(hint) is None
    hint.moved(None)
    assert start(hint) == (0, 8.0)


def test_a_reset_while_a_hinted_claim_ran_still_sends_the_next_claim_to_the_floor() -> None:
    """A wake-up at a more urgent priority resets the hint while a claim from it runs; that
    claim coming back empty says nothing of what lies below it."""
    hint = _FairHint()
    hint.moved((0, 5.0), from_floor=True)
    hint.moved((0, 6.0), from_floor=True)
    hint.forget()  # during the next claim, which started at (0, 5.0)
    hint.moved(None, from_floor=False)
    assert start(hint) is None
