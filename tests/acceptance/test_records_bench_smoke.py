"""The dedupe and records benches (bench/dedupe/suite.py, bench/records/suite.py), tiny, as
real processes.

Each must finish, drop its schema and write results.json with every mode or read; figures
are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from tests.conftest import run_python


@pytest.mark.parametrize(
    ("bench", "args", "key", "expected"),
    [
        (
            "dedupe",
            ["--rounds", "2", "--batch", "10", "--history", "100"],
            "modes",
            {"plain", "keyed", "keyed_window", "existing"},
        ),
        ("records", ["--history", "10000", "--repeat", "1"], "reads", None),
    ],
)
def test_small_bench_run_writes_every_result_and_drops_its_schema(
    dsn: str, tmp_path: Path, bench: str, args: list[str], key: str, expected: set[str] | None
) -> None:
    result = run_python(
        "-m", "bench", bench, "--dsn", dsn, "--out", str(tmp_path), *args, timeout=300
    )
    assert result.returncode == 0, result.stderr
    found = json.loads((tmp_path / "results.json").read_text())
    assert found["command"].startswith("python") and f"bench {bench}" in found["command"]
    if expected is not None:
        assert set(found[key]) == expected
    assert all(value for value in found[key].values())
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s", [f"bench_{bench}_%"]
        ).fetchone()
    assert row is not None and row[0] == 0
