"""The steady suite (bench/steady/suite.py) as CI runs it: `--short`, a real worker process per
system and real producer processes. The figures are the bench's; checked here: every system
that can run here and every bound measured the point, each with its setting named, latency
percentiles in order, CPU read for the producers and the worker, and the ratios computed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_python


def test_short_steady_bench_measures_each_system_and_the_bound(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "steady"
    result = run_python(
        "-m", "bench", "steady", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["command"].endswith(f"--out {out}")
    ran = report["systems"]
    assert "pgqueue" in ran and "bound_python" in ran  # neither needs anything installed
    for name in ("bound", "bound_psycopg"):
        assert name in ran or name in report["unavailable"], name
    for name in ("procrastinate", "pgqueuer", "chancy", "oban"):
        assert name in ran or name in report["unavailable"], name
    if sys.version_info < (3, 12):  # oban-py's own floor: the results say why it did not run
        assert report["unavailable"]["oban"].startswith("not run: oban-py"), report
        assert "- oban: not run: oban-py" in (out / "results.md").read_text()
    for name, found in ran.items():
        assert found["setting"], name
        [point] = found["points"]
        assert (point["producers"], point["rate"]) == (4, 200.0)
        assert 0 < point["started"] <= point["jobs"], name
        if name != "bound":  # pgbench spaces its own, a Poisson process: about 200
            # The jobs that warmed each producer connection are not among those measured.
            assert point["jobs"] == 200, (name, point["jobs"])
        assert 0 < point["p50_ms"] <= point["p90_ms"] <= point["p99_ms"], name
        assert point["finished_per_s"] > 0 and point["produced_per_s"] > 0, name
        assert point["cpu_s"]["producers"] is not None and point["cpu_s"]["worker"] is not None
        # Every job's enqueue is a transaction that writes, and so is every finish.
        assert point["xacts_per_job"] >= 1 and point["wal_bytes_per_job"] > 0, name
    [ratios] = report["ratios"]
    if "bound" in ran:
        assert ratios["finished_vs_bound"] > 0
    if "bound_psycopg" in ran:
        assert "from psycopg" in ran["bound_psycopg"]["setting"]
        assert ratios["finished_vs_bound_psycopg"] > 0 and ratios["p99_vs_bound_psycopg"] > 0
    # The Python-worker bound is run as the queues are: its latency from the producers'
    # commits to its handler's starts, its worker's CPU from /proc.
    assert "lease 100" in ran["bound_python"]["setting"]
    assert ratios["finished_vs_bound_python"] > 0 and ratios["p99_vs_bound_python"] > 0
    assert ratios["cpu_vs_bound_python"] > 0
    assert "pg_stat_statements" in report
    table = (out / "results.md").read_text()
    assert "### 4 producer connection(s)" in table and "### Ratios, this run" in table


def test_a_pgqueue_setting_run_only_when_named_is_accepted_and_others_are_refused() -> None:
    from bench.steady import suite

    config = suite.parse_args(["--setting", "pgqueue=claim_cooldown=0"])
    assert suite.setting_of(config, "pgqueue") == (100, "claim_cooldown=0")
    assert suite.setting_of(suite.parse_args([]), "pgqueue") == (100, "default")
    wrong = suite.parse_args(["--setting", "pgqueue=claim_cooldown=5"])
    with pytest.raises(RuntimeError, match="claim_cooldown=0"):
        suite.setting_of(wrong, "pgqueue")


def test_the_bare_worker_fed_by_pgqueues_enqueue_runs_only_when_named(
    dsn: str, tmp_path: Path
) -> None:
    from bench.steady import suite

    assert "bound_python_enqueue" not in suite.parse_args([]).systems
    out = tmp_path / "steady"
    result = run_python(
        "-m", "bench", "steady", "--short", "--dsn", dsn, "--out", str(out),
        "--systems", "bound_python_enqueue", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "results.json").read_text())
    [point] = report["systems"]["bound_python_enqueue"]["points"]
    # Its producers are pgqueue's: every job they enqueued was started by the bare worker.
    assert point["started"] == point["jobs"] > 0 and not point["fell_behind"]
    assert 0 < point["p50_ms"] <= point["p99_ms"]


def test_rounds_run_every_system_again_and_report_each_points_median(
    dsn: str, tmp_path: Path
) -> None:
    import statistics

    out = tmp_path / "steady"
    result = run_python(
        "-m", "bench", "steady", "--short", "--dsn", dsn, "--out", str(out),
        "--systems", "pgqueue,bound_python", "--rounds", "3", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    assert result.stderr.count("bench: steady round ") == 3
    report = json.loads((out / "results.json").read_text())
    assert report["config"]["rounds"] == 3
    for name in ("pgqueue", "bound_python"):
        found = report["systems"][name]
        [point] = found["points"]
        each = [r[0] for r in found["rounds"]]
        assert len(each) == 3 and all(p["started"] > 0 for p in each), name
        # The reported figures are the medians of the rounds' own, each round's p99 kept.
        assert point["rounds_measured"] == 3
        assert point["rounds_p99_ms"] == [p["p99_ms"] for p in each]
        for key in ("p50_ms", "p99_ms", "finished_per_s", "cpu_s_per_1000_worker"):
            assert point[key] == statistics.median(p[key] for p in each), (name, key)
        worker_cpu = statistics.median(p["cpu_s"]["worker"] for p in each)
        assert point["cpu_s"]["worker"] == worker_cpu
        assert point["fell_behind"] is False
    [ratios] = report["ratios"]
    mine, bare = (report["systems"][n]["points"][0] for n in ("pgqueue", "bound_python"))
    assert ratios["p99_vs_bound_python"] == mine["p99_ms"] / bare["p99_ms"]
    table = (out / "results.md").read_text()
    assert "3 rounds, every system once a round in a rotated order" in table
    assert "p99 ms, each round" in table
