"""The relay's suites as CI runs them (`--short`): bench/relay/chaos.py,
bench/relay/throughput.py and bench/relay/degradation.py. The figures are the benches';
checked here: the fault run lost and reordered nothing while it killed the leader and
restarted the broker, every message reached the broker, and every round was read both ways."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_python


def _suite(name: str, dsn: str, out: Path, *extra: str) -> dict[str, Any]:
    result = run_python(
        "-m", "bench", name, "--short", "--dsn", dsn, "--out", str(out), *extra, timeout=900
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "results.json").read_text())
    return report


def _redis_up() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", 6379)) == 0


def test_short_relay_chaos_loses_and_reorders_nothing(dsn: str, tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed: .ci/run installs it")
    report = _suite("relay-chaos", dsn, tmp_path / "chaos")
    assert report["lost"] == 0 and report["reordered"] == 0
    assert report["leader_kills"] >= 1 and report["broker_restarts"] == 1
    assert report["duplicates"] <= report["duplicates_bound"]


def test_short_relay_throughput_delivers_every_message(dsn: str, tmp_path: Path) -> None:
    if not _redis_up():
        pytest.skip("no Redis at 127.0.0.1:6379: .ci/run starts one")
    report = _suite("relay-throughput", dsn, tmp_path / "throughput", "--brokers", "redis")
    redis = report["brokers"]["redis"]
    assert redis["received"] == redis["messages"] and redis["refused"] == 0
    assert redis["relay_per_s"] > 0 and redis["bare_per_s"] > 0


def test_short_relay_degradation_reads_each_round_both_ways(dsn: str, tmp_path: Path) -> None:
    report = _suite("relay-degradation", dsn, tmp_path / "degradation")
    assert [r["published"] for r in report["rounds"]] == [report["per_round"]] * 3
    assert report["rounds"][-1]["dead_rows_behind"] == 2 * report["per_round"]
