"""`python -m bench`: one entry point that lists and runs every suite."""

from __future__ import annotations

import importlib
import json
import subprocess
from pathlib import Path

import pytest

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
        assert callable(importlib.import_module(f"bench.{module}").main), module
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


def test_a_full_run_replaces_its_suite_and_servers_folder_and_a_short_run_goes_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import report
    from bench.server import Server

    monkeypatch.setattr(report, "ROOT", tmp_path)
    server = Server("postgresql://", embedded=False, version="15.20", settings={})
    stale = tmp_path / "results" / "dedupe" / "pg15" / "old.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")

    full = report.Run("dedupe", ["--rounds", "2"]).folder(server)
    assert full == tmp_path / "results" / "dedupe" / "pg15" and not stale.exists()
    short = report.Run("dedupe", ["--short"], short=True).folder(server)
    assert short == tmp_path / "out" / "dedupe-short"
    chosen = report.Run("dedupe", [], out=tmp_path / "mine").folder(server)
    assert chosen == tmp_path / "mine" and chosen.is_dir()

    written = report.Run("dedupe", ["--rounds", "2"]).write(full, "r.json", server, {"n": 1})
    document = json.loads(written.read_text())
    assert document["command"] == "python -m bench dedupe --rounds 2"
    assert document["database"]["server_version"] == "15.20" and document["n"] == 1
