"""Several rounds of the steady suite as one set of figures: each point's median across rounds.

On a shared two-core machine one point's p99 moves by a factor of two or three between runs a
minute apart, for every system alike, so a single run can rank two systems either way. The
suite runs every system once per round, in a rotated order, and reports each point's median
of the rounds, with every round's p99 beside it so the spread is on the page.

Owns only arithmetic on results (never measuring anything): which rounds a point ran in,
the median of each figure, and whether the point fell behind in most rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

# Figures that say what a point was, not what it measured: the same in every round.
IDENTITY = ("producers", "rate", "offered_per_s")


def order(names: Sequence[str], round_index: int) -> list[str]:
    """The systems in the order round `round_index` runs them: each round starts one later,
    so no system always runs first, on a machine that is still settling, or last."""
    if not names:
        return []
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def combine(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One system's results from each round (as run_system or run_bound return them) as
    one: its setting, each point's median figures, and each round's points kept under
    `rounds`. One round comes back as it was."""
    if len(rounds) == 1:
        return dict(rounds[0])
    first = rounds[0]
    points = [
        median_point([_at(r["points"], p["producers"], p["rate"]) for r in rounds])
        for p in first["points"]
    ]
    return {
        **{k: v for k, v in first.items() if k != "points"},
        "points": points,
        "rounds": [r["points"] for r in rounds],
    }


def _at(points: Sequence[dict[str, Any]], producers: int, rate: float) -> dict[str, Any] | None:
    for point in points:
        if point["producers"] == producers and point["rate"] == rate:
            return point
    return None


def median_point(found: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """A point's figures from several rounds as one: the median of each number over the
    rounds that measured it. It fell behind if it did, or was skipped, in most rounds; a
    point skipped in every round stays skipped."""
    present = [p for p in found if p is not None]
    measured = [p for p in present if "skipped" not in p]
    if not measured:
        return dict(present[0])
    out: dict[str, Any] = {k: measured[0][k] for k in IDENTITY if k in measured[0]}
    for key in _union(measured):
        if key in IDENTITY or key == "fell_behind":
            continue
        values = [p.get(key) for p in measured]
        if all(isinstance(v, dict) for v in values if v is not None):
            out[key] = _median_dict([v for v in values if v is not None])
        else:
            out[key] = _median([v for v in values if _number(v)])
    behind = sum(1 for p in present if "skipped" in p or p.get("fell_behind"))
    out["fell_behind"] = behind * 2 > len(present)
    out["rounds_measured"] = len(measured)
    out["rounds_p99_ms"] = [p.get("p99_ms") for p in measured]
    return out


def _union(points: Sequence[dict[str, Any]]) -> list[str]:
    keys: dict[str, None] = {}
    for point in points:
        keys.update(dict.fromkeys(point))
    return list(keys)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _median_dict(values: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {key: _median([v[key] for v in values if _number(v.get(key))]) for key in _union(values)}
