"""How fast jobs reach a worker: whether it is steady.

Owns: the jobs each recent claim round found, over the last STEADY_WINDOW, and the judgment
the fetch loop (loop.py) reads after each round: steady while they come at one or more per
claim_cooldown, left below half that rate. While jobs arrive that fast the worker would claim
every cooldown anyway (the wake-ups between share one claim), and each wake-up only costs the
application's commit the database-wide notification lock. So a steady worker claims every
cooldown on its own, and its rows skip new jobs' wake-ups; below half that rate each claim
would find less than a job, and it asks for them again (a widening, interest.py).

Invariants:
- Only a window the worker spent claiming, ending in a short claim, is judged: after a stall
  (its process starved of CPU, a slow statement) the few claims in the window say nothing of
  the jobs arriving.
- Each spell that skips wake-ups (a queue claimed the way steady mode needs, interest.py)
  rewrites the worker's wake_listeners rows at its start and its end, and every enqueue reads
  them; under a long transaction each version stays behind for those reads to walk. A stream
  that hovers at the threshold would start and end such spells many times a second, so after
  a short one the worker rests (claims as a woken worker) before the next may start, the rest
  doubling with each short spell in a row and starting over after a long one. Resting only
  keeps wake-ups coming, which is always safe. A spell that rewrote nothing earns no rest: it
  cost the enqueues nothing, and a worker claiming every cooldown keeps up better.
"""

from __future__ import annotations

from collections import deque

# Seconds over which a worker judges how fast jobs arrive, to enter or leave steady mode.
STEADY_WINDOW = 0.05
# Seconds a worker rests from steady mode after its first short spell; each short spell in a
# row doubles it, up to LONGEST_REST. A spell of LONG_SPELL or more is not short.
FIRST_REST = 0.05
LONGEST_REST = 10.0
LONG_SPELL = 10.0


class Pace:
    """Steady or not, and when a steady worker's next claim is due; `judged` False (a worker
    that cannot skip wake-ups, or has no cooldown) keeps count but never turns steady."""

    def __init__(self, judged: bool) -> None:
        self.judged = judged
        self.steady = False
        self.spells = 0  # times the worker turned steady
        self.claim_at = 0.0  # a steady worker's next claim, by the monotonic clock
        self.rest = 0.0  # seconds a spell ending short makes the worker rest
        self._spell_began = 0.0
        self._rest_until = 0.0  # no spell begins before this, by the monotonic clock
        self._found: deque[tuple[float, int]] = deque()  # (began, jobs) per claim round

    def judge(self, began: float, found: int, full: bool, cooldown: float, rewrote: bool) -> None:
        """Enter or leave steady mode after a claim round that began at `began` and found
        `found` jobs (`full`: as many as it asked); `rewrote`: whether the spell under way
        skips wake-ups, so that its end rewrites the rows."""
        found_in = self._found
        found_in.append((began, found))
        while found_in and found_in[0][0] < began - STEADY_WINDOW:
            found_in.popleft()
        if not self.judged:
            return
        per_cooldown = sum(n for _, n in found_in) * cooldown / STEADY_WINDOW
        if not self.steady and per_cooldown >= 1 and began >= self._rest_until:
            self.steady = True
            self.spells += 1
            self._spell_began = began
        elif (
            self.steady
            and per_cooldown < 0.5
            and not full
            and len(found_in) * cooldown >= STEADY_WINDOW / 2
        ):
            self.steady = False
            if began - self._spell_began >= LONG_SPELL:
                self.rest = 0.0
            elif rewrote:
                self.rest = min(max(self.rest * 2, FIRST_REST), LONGEST_REST)
                self._rest_until = began + self.rest
        self.claim_at = began + cooldown
