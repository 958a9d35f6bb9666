"""The integrations suite (bench/integrations/suite.py) as CI runs it: `--short`. The figures are
the bench's; checked here: every variant ran its transactions, each enqueue stored its job
(the controls stored none), and the derived costs are present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_python

pytest.importorskip("django", reason="pip install django (the dev extra has it)")
pytest.importorskip("sqlalchemy", reason="pip install sqlalchemy (the dev extra has it)")


def test_short_integrations_bench_runs_every_variant(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "integrations"
    result = run_python(
        "-m", "bench", "integrations", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    enqueueing = [name for name in report["per_second"] if not name.startswith("control_")]
    assert {"psycopg", "django", "django_prepared", "sqlalchemy"} <= set(enqueueing)
    per_variant = report["transactions"] * report["rounds"] + min(200, report["transactions"])
    assert report["jobs_stored"] == per_variant * len(enqueueing)
    assert all(rate > 0 for rate in report["per_second"].values())
    assert set(report["integration_us"]) == {"django", "django_prepared", "sqlalchemy"}
