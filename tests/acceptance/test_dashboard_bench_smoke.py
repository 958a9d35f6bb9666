"""bench/dashboard/suite.py at its smallest: every page answered with its server time, and every
drain drained all its jobs. The figures are the bench's; checked here: the report holds a
time for each page and a rate for each drain mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_python

pytest.importorskip("uvicorn", reason="the dashboard bench needs pgqueue-py[dashboard]")
pytest.importorskip("opentelemetry.sdk", reason="the dashboard bench needs opentelemetry-sdk")


def test_the_dashboard_bench_times_every_page_and_drains_in_every_mode(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "dashboard"
    result = run_python(
        "-m", "bench", "dashboard", "--dsn", dsn, "--out", str(out), "--history", "10000",
        "--repeat", "1", "--jobs", "1000", "--rounds", "1", timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert len(report["pages"]) == 17
    assert all(page["server_median_ms"] > 0 for page in report["pages"].values())
    rates = report["drain"]["jobs_per_second"]
    assert set(rates["bench_noop"]) == {
        "plain", "metrics", "metrics+trace", "metrics+trace 1/10", "metrics+trace 1/100",
    }  # fmt: skip
    assert all(r > 0 for modes in rates.values() for runs in modes.values() for r in runs)
