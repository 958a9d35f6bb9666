"""`python -m bench`: one entry point that lists and runs every suite."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

from bench.__main__ import SUITES
from tests.conftest import run_python


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    result: subprocess.CompletedProcess[str] = run_python("-m", "bench", *args, timeout=600)
    return result


def test_the_entry_point_lists_every_suite_and_each_has_a_main() -> None:
    listed = _bench("--help")
    assert listed.returncode == 0, listed.stderr
    for name, (module, _) in SUITES.items():
        assert name in listed.stdout
        assert callable(importlib.import_module(module).main), module
    unknown = _bench("no-such-suite")
    assert unknown.returncode == 2 and "choose one of" in unknown.stderr


def test_a_suite_runs_through_the_entry_point(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "dedupe"
    ran = _bench(
        "dedupe", "--dsn", dsn, "--rounds", "2", "--batch", "10", "--history", "100",
        "--out", str(out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    results = json.loads((out / "results.json").read_text())
    assert results
