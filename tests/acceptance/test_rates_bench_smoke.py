"""The rates bench (bench/rates/suite.py) as CI runs it: `--short`, a real process.

It must drain every cost scenario whole and run both holds; the figures themselves are not
checked here (speed belongs in bench/), except the one thing the limit promises: no second
held more starts than the limit, and a limited task leaves the queue's other jobs free to run.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_rates_bench_drains_every_scenario_and_holds_the_limit(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "rates"
    result = run_python(
        "-m", "bench", "rates", "--short", "--dsn", dsn, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert set(report["cost"]) == {
        "unlimited",
        "keyed_statement",
        "rated_100",
        "rated_10000",
        "task_rated_100",
        "task_rated_10000",
        "other_task_limited",
    }
    for name, scenario in report["cost"].items():
        assert scenario["claimed"] == report["jobs"], name  # each job claimed once
    held = report["hold"]
    assert held["started"] > held["limit_per_second"]
    assert held["most_in_any_second"] <= held["limit_per_second"]
    task_held = report["task_hold"]
    assert task_held["started"] > task_held["limit_per_second"]
    assert task_held["most_in_any_second"] <= task_held["limit_per_second"]
    assert task_held["unlimited_done"] == task_held["unlimited_backlog"]
