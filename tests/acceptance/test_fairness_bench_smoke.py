"""The fairness bench (bench/fairness/suite.py) as CI runs it: `--short`, a real process.

It must measure the quiet tenants beside a flood and without one, the shares of three
weighted keys and the two claims' cost; the figures themselves are not checked here (speed
belongs in bench/), except that every quiet job started and the shares sum to one.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_fairness_bench_measures_waits_shares_and_claim_cost(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "fairness"
    result = run_python(
        "-m", "bench", "fairness", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "fairness.json").read_text())
    for run in ("quiet", "quiet_control"):
        assert report[run]["quiet_started"] == report[run]["quiet_jobs"] > 0, report[run]
    assert report["quiet"]["backlog"] == 10_000 and report["quiet_control"]["backlog"] == 0
    shares = report["shares"]
    assert set(shares["shares"]) == {"w1", "w2", "w4"}
    assert abs(sum(shares["shares"].values()) - 1) < 1e-9
    cost = report["claim_cost"]
    assert cost["fair_ms_p50"] > 0 and cost["plain_ms_p50"] > 0
