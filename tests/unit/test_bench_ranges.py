"""bench/ranges.py: which run stands for a day, and a ratio with too few days marked."""

from __future__ import annotations

from typing import Any

from bench import ranges


def _steady(started: str, pgqueue: float | None, pgqueuer: float) -> ranges.Run:
    def system(finished: float | None) -> dict[str, Any]:
        if finished is None:
            return {"points": [{"producers": 16, "rate": 4000.0, "skipped": "fell behind"}]}
        point = {"producers": 16, "rate": 4000.0, "finished_per_s": finished, "p99_ms": 5.0}
        return {"points": [point]}

    results = {
        "bench": "steady",
        "started_at": started,
        "config": {"producers": [16], "rates": [4000.0]},
        "systems": {"pgqueue": system(pgqueue), "pgqueuer": system(pgqueuer)},
    }
    return ranges.Run(f"run {started}", results)


AGAINST_PGQUEUER = next(
    r for r in ranges.RATIOS if r.label == "jobs finished, 16 connections, 4,000 offered / PgQueuer"
)


def test_the_last_run_of_a_day_stands_for_it() -> None:
    runs = [
        _steady("2026-12-02T22:00:00+00:00", 3000.0, 1500.0),
        _steady("2026-12-02T09:00:00+00:00", 3000.0, 1000.0),
        _steady("2026-12-03T08:00:00+00:00", 3000.0, 3000.0),
    ]
    chosen = ranges.per_day(runs, AGAINST_PGQUEUER)
    assert {day: figure for day, (_, figure) in chosen.items()} == {
        "2026-12-02": ([2.0], ""),
        "2026-12-03": ([1.0], ""),
    }


def test_a_later_run_that_lost_the_point_is_not_replaced_by_an_earlier_one() -> None:
    runs = [
        _steady("2026-12-02T09:00:00+00:00", 3000.0, 1000.0),
        _steady("2026-12-02T22:00:00+00:00", None, 1000.0),
    ]
    chosen = ranges.per_day(runs, AGAINST_PGQUEUER)
    assert chosen["2026-12-02"][1] == ([], "not all measured")


def test_a_ratio_of_fewer_than_three_days_is_marked() -> None:
    two = [_steady(f"2026-12-0{d}T09:00:00+00:00", 3000.0, 1500.0) for d in (1, 2)]
    row = next(line for line in ranges.markdown(two, "cmd").splitlines() if "/ PgQueuer" in line)
    assert row.endswith("| 2.00 | **2: too few** |")
    three = [*two, _steady("2026-12-03T09:00:00+00:00", 3000.0, 1000.0)]
    row = next(line for line in ranges.markdown(three, "cmd").splitlines() if "/ PgQueuer" in line)
    assert row.endswith("| 2.00-3.00 | 3 |")
