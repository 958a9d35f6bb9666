"""The partitions suite (bench/partitions/suite.py) as CI runs it: `--short`. The figures are the
bench's; checked here: the partitioned schema dropped its oldest day as a table and deleted
no row, leaving no dead tuple, while the one-table schema deleted the same rows in batches."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_partitions_bench_drops_a_day_where_the_one_table_deletes_it(
    dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "partitions"
    result = run_python(
        "-m", "bench", "partitions", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    part, flat = report["partitioned"], report["one_table"]
    assert len(part["partitions_dropped"]) == 1 and part["rows_deleted"] == 0
    assert part["after"]["dead_estimate"] == 0
    assert flat["partitions_dropped"] == [] and flat["rows_deleted"] == flat["rows_gone"] > 0
    assert part["rows_gone"] == flat["rows_gone"]  # the same day, the same rows
