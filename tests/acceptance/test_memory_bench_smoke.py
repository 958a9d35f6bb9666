"""The memory suite (bench/memory/suite.py) as CI runs it: `--short`, a real worker process whose
resident set is read from /proc while it drains. The figures are the bench's; checked here:
it drained the backlog, took a sample every interval, and read plausible sizes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_python


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_short_memory_bench_samples_a_draining_worker(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "memory"
    result = run_python(
        "-m", "bench", "memory", "--short", "--dsn", dsn, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["drained"] == report["jobs"]
    assert len(report["samples"]) >= report["seconds"] / report["every"] - 1
    assert 10 < report["idle_rss_mb"] <= report["peak_mb"] < 2048
