"""The workflows bench (bench/workflows/suite.py) as CI runs it: `--short`, a real process.

It must drain both claim scenarios whole, finish both finish scenarios, and run every chord
to its callback; the figures themselves are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_workflows_bench_drains_every_scenario_and_runs_the_chord(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "workflows"
    result = run_python(
        "-m", "bench", "workflows", "--short", "--dsn", dsn, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    for part in ("claim", "finish"):
        for name, scenario in report[part].items():
            assert scenario["claimed"] == report["jobs"], (part, name)  # each claimed once
    assert report["waiting_jobs"] == 5000
    rounds = report["fan_in"]["rounds"]
    assert len(rounds) == 1 and rounds[0]["members"] == 500
    assert rounds[0]["fan_in_ms"] >= 0  # the callback started after its last member ended
    assert report["command"].endswith(f"--out {out}")
