"""The lifecycle bench (bench/lifecycle/suite.py) as CI runs it: `--short`, a real worker
process per drained scenario. The figures are the bench's; checked here: every scenario
enqueued and drained every job, its counts are there (per table, per index where the server
can count them), each phase's CPU was read on both sides (the test's server runs on this
machine) and results.md names the worker's own statements."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_lifecycle_bench_counts_every_scenario(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "lifecycle"
    result = run_python(
        "-m",
        "bench",
        "lifecycle",
        "--short",
        "--jobs",
        "200",
        "--dsn",
        dsn,
        "--out",
        str(out),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["command"].endswith(f"--out {out}")
    assert set(report["scenarios"]) == {"one_c10", "bulk_c100", "bound_b10", "bound_b100"}
    for name, found in report["scenarios"].items():
        assert found["enqueue"]["tables"]["jobs"]["inserted"] == 200, name
        drained = found["drain"]["tables"]
        assert drained["jobs"]["deleted"] == 200, name
        assert sum(t["inserted"] for n, t in drained.items() if n.startswith("job_history")) == 200
        assert found["drain"]["transactions"] > 0 and found["drain"]["wal"]["records"] > 0, name
        if report["counted"]["index_inserts"]:
            assert found["drain"]["wal_records"]["index_inserts"]["jobs_pkey"] >= 200, name
        for phase in ("enqueue", "drain"):
            spent = found[phase]["cpu"]
            assert spent["wall_s"] > 0 and spent["client_cpu_s"] > 0, (name, phase)
            assert spent["server_cpu_s"] is not None and spent["server_cpu_s"] >= 0, (name, phase)
        # A worker process that imports pgqueue spends more than a bare SQL loop, and its
        # start and stop, read apart, are taken out of the table's figure.
        if not name.startswith("bound"):
            assert found["drain"]["cpu"]["start_stop"]["client_cpu_s"] > 0, name
    # Ticks of 10 ms can round one short phase's server CPU to nothing, never all of them.
    assert sum(f[p]["cpu"]["server_cpu_s"] for f in report["scenarios"].values() for p in f
               if p in ("enqueue", "drain")) > 0  # fmt: skip
    table = (out / "results.md").read_text()
    assert "## Per 1,000 jobs" in table and "## Time and CPU" in table
    if report["counted"]["statements"]:
        assert "job_finish_many" in table and "lease_finish.sql claim" in table
    else:
        assert "pg_stat_statements" in " ".join(report["missing"])
