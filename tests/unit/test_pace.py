"""pace.py: when a worker turns steady, and how often a stream at the threshold may make it
start a spell (each start and end rewrites the rows every enqueue reads)."""

from __future__ import annotations

import random

from pgqueue.worker.pace import FIRST_REST, LONG_SPELL, LONGEST_REST, STEADY_WINDOW, Pace

COOLDOWN = 0.002


def _claim_every_cooldown(
    pace: Pace, start: float, seconds: float, per_claim: float, *, rewrote: bool = True
) -> float:
    """Claim rounds a cooldown apart for `seconds`, each finding `per_claim` jobs on
    average (drawn at random); returns the time after the last."""
    rng = random.Random(7)
    now = start
    while now < start + seconds:
        found = int(per_claim) + (rng.random() < per_claim % 1)
        pace.judge(now, found, False, COOLDOWN, rewrote)
        now += COOLDOWN
    return now


def test_a_stream_above_the_threshold_turns_the_worker_steady_and_keeps_it() -> None:
    pace = Pace(True)
    _claim_every_cooldown(pace, 0.0, 60.0, 3)
    assert pace.steady and pace.spells == 1


def test_a_stream_at_the_threshold_starts_few_spells() -> None:
    pace = Pace(True)
    now = 0.0
    for _ in range(600):  # ten minutes of 100-ms swings about one job per cooldown
        now = _claim_every_cooldown(pace, now, 0.05, 1.4)
        now = _claim_every_cooldown(pace, now, 0.05, 0.2)
    # Without a rest it would start a spell at each swing: 600 of them.
    assert pace.spells <= 600 / LONGEST_REST * 2
    assert pace.rest == LONGEST_REST


def test_a_spell_starts_after_its_rest_and_a_long_one_ends_the_rests() -> None:
    pace = Pace(True)
    now = _claim_every_cooldown(pace, 0.0, 0.1, 2)  # a short spell
    assert pace.steady
    now = _claim_every_cooldown(pace, now, STEADY_WINDOW, 0)
    assert not pace.steady and pace.rest == FIRST_REST
    now = _claim_every_cooldown(pace, now, FIRST_REST / 2, 2)
    assert not pace.steady  # resting: jobs come fast, but it is still woken for each
    now = _claim_every_cooldown(pace, now, FIRST_REST, 2)
    assert pace.steady and pace.spells == 2
    now = _claim_every_cooldown(pace, now, LONG_SPELL, 2)
    _claim_every_cooldown(pace, now, STEADY_WINDOW, 0)
    assert not pace.steady and pace.rest == 0


def test_a_spell_that_rewrote_no_rows_earns_no_rest() -> None:
    pace = Pace(True)
    now = 0.0
    for _ in range(100):
        now = _claim_every_cooldown(pace, now, 0.05, 1.4, rewrote=False)
        now = _claim_every_cooldown(pace, now, 0.05, 0.2, rewrote=False)
    assert pace.rest == 0 and pace.spells >= 50


def test_a_worker_that_cannot_skip_wake_ups_never_turns_steady() -> None:
    pace = Pace(False)
    _claim_every_cooldown(pace, 0.0, 1.0, 3)
    assert not pace.steady and pace.spells == 0
