"""The Citus suite (bench/citus/suite.py) as CI runs it: `--short`, a cluster and a plain
server of its own, real `pgqueue worker` processes. The figures are the bench's; checked
here: every job ran once on each system, each server's costs were read, the steady state
ran every job it offered, the plans are the ones the docs describe, a bare row's cost was
read on both, and the model was worked out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.citus import cluster
from tests.conftest import run_python

pytestmark = pytest.mark.citus


def test_short_citus_bench_drains_on_each_system_and_models_w_nodes(tmp_path: Path) -> None:
    why = cluster.installed()
    if why:
        pytest.skip(f"Citus is not available: {why}")
    out = tmp_path / "citus"
    result = run_python("-m", "bench", "citus", "--short", "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert set(report["systems"]) == {"single", "coordinator", "nodes"}
    for name, got in report["systems"].items():
        assert got["drain_jobs_per_second"] > 0
        roles = {"single"} if name == "single" else {"coordinator", "node1", "node2"}
        for phase in ("enqueue", "drain"):
            assert set(got[phase]) == roles
            assert all(
                cost["cpu_ms"] > 0 and cost["statements"] > 0 for cost in got[phase].values()
            )
        kept = got["steady"]
        assert kept["jobs"] > 0 and set(kept["servers"]) == roles
        assert 0 <= kept["wait_p50_ms"] <= kept["wait_p99_ms"]
    assert report["plans"]["through_coordinator_task_count_1"]
    assert report["plans"]["on_node_without_citus"]
    floor = report["floor"]
    assert floor["single"]["single"]["cpu_ms"] > 0
    assert set(floor["cluster"]) == {"coordinator", "node1", "node2"}
    model = report["model"]
    assert model["node_cpu_ms_per_job"] > 0 and model["coordinator_cpu_ms_per_job"] > 0
    assert model["bare_row_node_vs_single"] > 0 and model["drain_node_vs_single"] > 0
    assert [row["nodes"] for row in model["rows"]] == [2, 4, 8, 16, 32]
