"""bench/steady/rounds.py: the order each round runs the systems in, and a point's median
over rounds when some rounds fell behind or skipped it."""

from __future__ import annotations

from bench.steady import rounds


def test_each_round_starts_one_system_later() -> None:
    names = ["pgqueue", "pgqueuer", "bound"]
    assert [rounds.order(names, i) for i in range(4)] == [
        ["pgqueue", "pgqueuer", "bound"],
        ["pgqueuer", "bound", "pgqueue"],
        ["bound", "pgqueue", "pgqueuer"],
        ["pgqueue", "pgqueuer", "bound"],
    ]
    assert rounds.order([], 2) == []


def _point(p99: float, *, behind: bool = False) -> dict[str, object]:
    return {
        "producers": 16, "rate": 4000.0, "offered_per_s": 4000.0, "jobs": 100,
        "started": 90 if behind else 100, "fell_behind": behind, "p99_ms": p99,
        "cpu_s": {"producers": p99 / 10, "worker": None},
    }  # fmt: skip


def test_a_point_that_fell_behind_in_most_rounds_fell_behind() -> None:
    skipped = {"producers": 16, "rate": 4000.0, "skipped": "fell behind at 2,000 jobs/s"}
    combined = rounds.median_point([_point(5.0), _point(9.0, behind=True), skipped])
    assert combined["fell_behind"] is True  # behind once and skipped once, of three
    assert combined["p99_ms"] == 7.0 and combined["rounds_p99_ms"] == [5.0, 9.0]
    assert combined["rounds_measured"] == 2 and combined["started"] == 95
    # A figure no round measured stays unmeasured.
    assert combined["cpu_s"] == {"producers": 0.7, "worker": None}
    kept = rounds.median_point([_point(5.0), _point(9.0, behind=True), _point(6.0)])
    assert kept["fell_behind"] is False and kept["p99_ms"] == 6.0
    assert rounds.median_point([skipped, skipped]) == skipped


def test_one_round_comes_back_as_it_ran() -> None:
    ran = {"setting": "default", "points": [_point(5.0)]}
    assert rounds.combine([ran]) == ran
    two = rounds.combine([ran, {"setting": "default", "points": [_point(7.0)]}])
    assert two["points"][0]["p99_ms"] == 6.0 and len(two["rounds"]) == 2
