"""The degradation bench (bench/degradation/suite.py) as CI runs it: `--short`, a real process.

It must write a sample row per second for every strategy and mode, a summary with a claim
time for each, and the charts; figures are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_python

STRATEGIES = ("plain", "hint", "default")
MODES = ("control", "hold")
CHARTS = ("depth.png", "claim_p50.png", "dead_tuples.png")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="the bench draws its charts with matplotlib: pip install -e '.[bench]'",
)


def test_short_bench_writes_samples_summary_and_charts_for_every_strategy(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "degradation"
    result = run_python(
        "-m", "bench", "degradation", "--short", "--dsn", dsn, "--out", str(out), timeout=120
    )
    assert result.returncode == 0, result.stderr

    with (out / "samples.csv").open(newline="") as rows:
        samples = list(csv.DictReader(rows))
    runs = {(row["strategy"], row["mode"]) for row in samples}
    assert runs == {(s, m) for s in STRATEGIES for m in MODES}
    # The 10-s windows: a run shorter than one still has its rest as a window.
    with (out / "windows.csv").open(newline="") as rows:
        windows = list(csv.DictReader(rows))
    assert {(row["strategy"], row["mode"]) for row in windows} == runs
    assert all(row["depth_max"] != "" and row["floor_claim_calls"] != "" for row in windows)

    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["strategies"]) == set(STRATEGIES)
    for strategy in STRATEGIES:
        for mode in MODES:
            p50 = summary["strategies"][strategy][mode]["claim_p50_end_ms"]
            assert isinstance(p50, float), (strategy, mode, p50)
    assert summary["command"].endswith(f"--out {out}")
    assert all("floor claim" in run["windows"]["kinds"] for run in summary["runs"])

    for chart in CHARTS:
        assert (out / chart).stat().st_size > 0, chart
    assert "strategy" in result.stdout  # the summary table


def test_short_bench_runs_beside_jobs_parked_by_durable_sleeps_and_waits(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "degradation-sleeping"
    result = run_python(
        "-m", "bench", "degradation", "--short", "--strategies", "default", "--modes",
        "control", "--sleeping", "2000", "--dsn", dsn, "--out", str(out), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sleeping_jobs"] == 2000
    assert isinstance(summary["strategies"]["default"]["control"]["claim_p50_end_ms"], float)
    assert "2,000 jobs parked by durable sleeps and signal waits" in result.stdout
