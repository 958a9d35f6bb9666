"""The tenants bench (bench/tenants/suite.py) as CI runs it: `--short`, a real process.

It must measure every scenario, the fairness run and its control, and draw its chart; the
figures themselves are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import run_python

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="the bench draws its chart with matplotlib: pip install -e '.[bench]'",
)


def test_short_tenants_bench_measures_every_scenario_and_fairness(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "tenants"
    result = run_python(
        "-m", "bench", "tenants", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "tenants.json").read_text())
    expected = {"main", "none", "none-keyed-stmt"}
    kinds = ("keys", "naive", "naive-hinted")
    expected |= {f"{kind}-{n}" for kind in kinds for n in (1, 100, 10_000)}
    expected |= {"saturated-keys", "saturated-naive", "saturated-naive-hinted"}
    assert set(report["cost"]) == expected
    for name, cost in report["cost"].items():
        if not name.startswith("saturated"):
            assert cost["claimed_per_run"] == 3000, name  # every job claimed exactly once
        assert cost["jobs_per_second"] > 0
        # Each scenario recorded the plan of its claim statement; ours must read jobs only
        # through indexes (the figures themselves are not checked here).
        assert cost["plan"]["generic"]["jobs_scans"], name
        if name.startswith(("keys", "saturated-keys", "none")):
            assert cost["index_scan"], (name, cost["plan"])
    assert report["fairness"]["first_small_wait_s"] > 0
    assert report["fairness"]["claims_before_first_small"] >= 1
    assert report["fairness_control"]["small_wait_s"] > 0
    assert (out / "tenants.png").stat().st_size > 0
