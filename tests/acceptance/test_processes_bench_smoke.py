"""The processes suite (bench/processes/suite.py) as CI runs it: `--short`, the real CLI with
`--processes 1` and `--processes 2`. The figures are the bench's; checked here: every job of
each drain ran once, and the steady phase's jobs all started and were timed."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_processes_bench_drains_with_one_and_two_processes(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "processes"
    result = run_python(
        "-m", "bench", "processes", "--short", "--dsn", dsn, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert set(report["processes"]) == {"1", "2"}
    for got in report["processes"].values():
        assert got["ran_once"] == [got["jobs"]]
        assert got["drain_jobs_per_second"] > 0
        assert got["steady_behind"] == [0]
        assert 0 <= got["steady_p50_ms"] <= got["steady_p99_ms"]
