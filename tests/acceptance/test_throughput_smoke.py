"""The throughput bench (bench/throughput/suite.py) as CI runs it: `--short`, a real process.

It must write results.json, results.md and every chart, with a row for every workload and
every system that can run here (or a note saying why it cannot), each with positive figures.
Figures are never compared here: speed belongs in bench/.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

SYSTEMS = ("pgqueue", "procrastinate", "pgqueuer", "chancy", "oban")
CHARTS = ("drain.png", "enqueue.png", "latency.png", "claim_cost.png")
RAW = {
    "claim_delete",
    "lease_finish",
    "psycopg_lifecycle",
    "psycopg_insert",
    "insert",
    "insert_notify",
    "insert_many",
    "copy",
}

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="the bench draws its charts with matplotlib: pip install -e '.[bench]'",
)


def positive_figures(row: dict[str, Any]) -> None:
    assert "failed" not in row, row
    assert row["runs"], row
    for name, figure in row["summary"].items():
        if name.endswith("_ms") and "gap_s" in row["params"]:
            # Commit to handler start, the commit's time read once the producer's commit
            # returned: a worker that sees the row first (the commit is visible before its
            # reply is read) starts it a hair earlier, so a latency may be just below zero.
            assert figure["min"] > -5, (row["params"], name, figure)
        else:
            assert figure["min"] > 0, (row["system"], row["params"], name, figure)
        assert figure["min"] <= figure["median"] <= figure["max"], (row["params"], name)
    if "max_ms" in row["summary"]:  # some job started after its commit returned
        assert row["summary"]["max_ms"]["max"] > 0, row["summary"]


def test_short_throughput_bench_writes_every_workload_row_and_chart(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "throughput"
    result = _bench("throughput", "--short", "--dsn", dsn, "--out", str(out), timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    workloads = results["workloads"]
    runnable = [s for s in SYSTEMS if s not in results["unavailable"]]
    assert "pgqueue" in runnable
    if sys.version_info < (3, 12):  # oban-py's own floor: the row says why it did not run
        assert results["unavailable"]["oban"].startswith("not run: oban-py"), results
    for name in set(SYSTEMS) - set(runnable):
        assert results["unavailable"][name].startswith(("not installed", "not run")), name

    # Every system at concurrency 10, and PgQueuer also at its settings with no cap (None).
    uncapped = {("pgqueuer", None)} if "pgqueuer" in runnable else set()
    expected = {
        "drain": {(s, 10) for s in runnable} | uncapped,
        "enqueue": {(s, m) for s in runnable for m in ("sequential", "concurrent", "bulk")},
        "idle": {(s, None) for s in runnable},
        "steady": {(s, None) for s in runnable},
        "claim": {("pgqueue", 100), ("pgqueue", 1000)},
    }
    keys = {"drain": "concurrency", "enqueue": "mode", "claim": "queued"}
    for workload, want in expected.items():
        rows = workloads[workload]["rows"]
        got = {(r["system"], r["params"].get(keys.get(workload, ""))) for r in rows}
        assert got == want, workload
        if workload in ("drain", "idle", "steady"):  # each row names the setting it ran at
            assert all(r["params"]["setting"] for r in rows), workload
        for row in rows:
            positive_figures(row)
        assert len(workloads[workload]["loadavg_start"]) == 3

    if shutil.which("pgbench") or Path("/usr/bin/pgbench").exists():
        raw_rows = workloads["raw"]["rows"]
        assert {r["params"]["workload"] for r in raw_rows} == RAW
        for row in raw_rows:
            positive_figures(row)
        # The lifecycle from psycopg at both batches, in every shape; a run that left a job
        # unfinished fails its row instead.
        python = {
            (r["params"]["batch"], r["params"]["shape"])
            for r in raw_rows
            if r["params"]["workload"] == "psycopg_lifecycle"
        }
        assert python == {(b, s) for b in (10, 100) for s in ("one", "two", "apart")}

    assert len(results["targets"]) == 9
    assert "### Where the gaps are" in (out / "results.md").read_text()
    for chart in CHARTS:
        assert (out / chart).stat().st_size > 0, chart
    table = (out / "results.md").read_text()
    assert "### Drain" in table and "oban" in table
    assert results["command"].endswith(f"--out {out}")


def test_bulk_pairs_write_each_pair_and_their_ratio(dsn: str, tmp_path: Path) -> None:
    """bench/throughput/pairs.py, tiny: pgqueue's bulk enqueue and the raw COPY, alternating."""
    out = tmp_path / "pairs"
    command = ["--dsn", dsn, "--out", str(out), "--pairs", "2", "--jobs", "300", "--batch", "100"]
    result = _bench("throughput-pairs", *command, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert len(results["pairs"]) == 2
    for pair in results["pairs"]:
        assert pair["pgqueue"] > 0 and pair["raw_copy"] > 0
        assert pair["ratio"] == pytest.approx(pair["pgqueue"] / pair["raw_copy"])
    ratio = results["ratio"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"]
    assert results["command"].endswith("--batch 100")
    assert result.stdout.count("ratio") == 2


def test_bulk_pairs_refuse_a_bad_count(tmp_path: Path) -> None:
    result = _bench("throughput-pairs", "--pairs", "0", "--out", str(tmp_path), timeout=60)
    assert result.returncode == 2
    assert "--pairs must be greater than 0" in result.stderr


def _bench(suite: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a suite as CI would, with no DSN from the environment: only --dsn counts."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "bench", suite, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
