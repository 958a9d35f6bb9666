"""The safety net's sweep: where each queue's next bounded look for jobs left behind its hint is.

Owns: per queue, the slice of the jobs table's pages that the safety net looks at next.

Invariants:
- A slice is a range of the table's heap pages [lo, hi), read once each by a TID range scan
  (job_sweep_find): its walk is bounded by the slice, never by the dead rows a long
  transaction keeps, whatever the jobs' priorities and ids. Each job it finds at or before
  the hint is claimed at its own position, one claim index descent each.
- A slice spans at least SWEEP_MIN_PAGES pages, and GAIN times what the table grew by since
  the slice before, so the sweep gains on the table however fast it grows. One slice per
  reset, from the first page to the last, then again from the first: a cycle takes at most
  pages / max(SWEEP_MIN_PAGES, (GAIN - 1) x pages the table grows by per reset) resets. With
  a long transaction holding the horizon the table grows with its age, and a cycle takes
  about a third of that age; without one, the table stays small and a slice or two cover it.
- So a queued job no wake-up named is found within one cycle, wherever its row lies (an old
  retried or promoted job, at any priority). Its row moves only when it is written again,
  and the writes that leave a job claimable announce it; one committed late is the claims'
  to find (its wake-up, or the transactions they watch), as for a claim from the floor.
- A slice that found SWEEP_FOUND jobs or more is looked at again at the next reset, not
  passed, since it may hold more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

# The least a slice spans, in pages of the jobs table: a table that grows slowly is still
# gone round in a bounded number of resets, each reading about this many pages.
SWEEP_MIN_PAGES = 1000
SWEEP_FOUND = 100  # jobs one slice claims at most; more wait for the next reset
# How much faster than the table grows a slice goes: a slice's walk grows with it, a cycle
# shrinks (GAIN - 1 times the growth gained per reset).
GAIN = 4


At = TypeVar("At")  # a job's position in its claim's order: (priority, id) or (priority, vtime)


@dataclass
class Sweep(Generic[At]):
    """One queue's sweep (of its plain claim's or of its fair claim's hint)."""

    at: int = 0  # where the next slice begins (a page)
    pages: int | None = None  # the table's pages at the last slice
    grown: int = 0  # what it grew by between the last two slices
    due: bool = False  # a reset came: take the next slice at the next round
    hi: int = 0  # the current slice's end (exclusive)
    # The jobs the current slice found, still to claim, in claim order.
    pending: list[At] = field(default_factory=list)

    def slice(self) -> tuple[int, int]:
        """The next slice's pages [lo, hi)."""
        self.hi = self.at + max(SWEEP_MIN_PAGES, GAIN * self.grown)
        return self.at, self.hi

    def found(self, pages: int, jobs: list[At]) -> None:
        """What job_sweep_find (or its fair twin) saw in the slice, and the table's pages then."""
        self.grown = max(pages - self.pages, 0) if self.pages is not None else 0
        self.pages = pages
        self.pending = jobs
        if len(jobs) < SWEEP_FOUND:
            self.at = self.hi if self.hi < pages else 0
