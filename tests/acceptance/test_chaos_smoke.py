"""The chaos suite (bench/chaos/suite.py) as CI runs it: a short run of the faults that need no
server restart, as a real process with real worker and producer processes.

It must exit 0 and its results must show that the faults happened and that no committed job
was lost, no rolled-back job ran and no atomic job ran twice. Speed is not checked here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Run on each server CI tests against: exactly-once with killed workers, on each server.
pytestmark = pytest.mark.each_server

SCENARIOS = ("kill9", "terminate", "rollback")
MODES = ("lease", "atomic")


def test_short_chaos_run_loses_no_job_runs_no_rolled_back_job_and_no_atomic_job_twice(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "chaos"
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    command = [
        sys.executable,
        "-m",
        "bench",
        "chaos",
        "--short",
        "--scenarios",
        ",".join(SCENARIOS),
    ]
    command += ["--jobs", "300", "--dsn", dsn, "--out", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr

    results = json.loads((out / "results.json").read_text())
    rows = {(row["scenario"], row["mode"]): row for row in results["rows"]}
    assert set(rows) == {(s, m) for s in SCENARIOS for m in MODES}
    for (scenario, mode), row in rows.items():
        assert row["enqueued"] == 300, (scenario, mode, row)
        assert row["lost"] == 0, (scenario, mode, row["examples"])
        assert row["rolled_back_ran"] == 0, (scenario, mode, row["examples"])
        if mode == "atomic":
            assert row["ran_twice"] == 0, (scenario, mode, row["examples"])
        faults = [event["fault"] for event in row["faults"]]
        if scenario == "rollback":
            assert 0 < row["committed"] < 300 and row["rolled_back"] > 0, row
        else:
            assert row["committed"] == 300 and faults and set(faults) == {scenario}, row
    assert (out / "results.md").read_text().count("| kill9 |") == 2
    assert "| scenario |" in result.stdout  # the table
