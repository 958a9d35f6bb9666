"""The durable bench (bench/durable/suite.py) as CI runs it: `--short`, with a real worker
process for the waits.

Every part must run whole: each kind of checkpoint ran every round, both shapes of the
chains part drained, the parked jobs were there, and every wait returned; results.md has a
section per part. The figures themselves are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_durable_bench_runs_every_part_whole(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "durable"
    result = run_python(
        "-m", "bench", "durable", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["command"].endswith(f"--out {out}")
    config, parts = report["config"], report["parts"]
    assert set(parts) == {"checkpoints", "chains", "parked", "wake"}

    kinds = {f"{task} {work}" for task in ("lease", "atomic") for work in ("noop", "insert")}
    assert set(parts["checkpoints"]) == kinds
    for name, found in parts["checkpoints"].items():
        assert found["rounds"] == config["steps"], name
        assert found["step_ms_p50"] > 0, name

    works = ("noop (lease)", "insert (atomic)")
    expected = {f"{w}, concurrency {c}" for w in works for c in config["chain_concurrency"]}
    assert set(parts["chains"]) == expected
    for name, found in parts["chains"].items():
        for shape in ("durable", "chain"):
            assert len(found["runs"][shape]) == config["rounds"], (name, shape)
            assert found[shape]["per_s"] > 0, (name, shape)

    parked = parts["parked"]
    assert sum(parked["parked_jobs"].values()) == config["parked"]
    for schema in ("plain", "parked"):
        assert len(parked[schema]["claim_runs"]) == config["rounds"], schema
        assert all(run["claims"] == config["claims"] for run in parked[schema]["claim_runs"])

    wake = parts["wake"]
    assert wake["commit"]["from_commit"]["jobs"] == config["waiters"]
    assert wake["worker"]["from_handler_return"]["jobs"] == config["waiters"]

    table = (out / "results.md").read_text()
    for section in ("## checkpoints", "## chains", "## parked", "## wake"):
        assert section in table, section
