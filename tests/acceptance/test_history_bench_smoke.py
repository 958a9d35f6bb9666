"""The history bench (bench/history/suite.py) as CI runs it: `--short`, a real process.

It must time every read with and without the index, archiving, both prunes and VACUUM, and
delete exactly what it says; figures are not checked here (speed belongs in bench/).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_history_bench_times_reads_archiving_and_prunes(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "history"
    result = run_python(
        "-m", "bench", "history", "--short", "--dsn", dsn, "--out", str(out), timeout=300
    )
    assert result.returncode == 0, result.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["rows"] == 20_000 and data["database"]["server_version"]
    reads = ("reads_without_index", "reads_with_index", "reads_after_prune")
    names = set(data["reads_without_index"])
    assert len(names) == 7 and all(set(data[r]) == names for r in reads)
    timed = [v[mode] for r in reads for v in data[r].values() for mode in ("custom", "prepared")]
    assert all(t["n"] == 20 and t["p50_ms"] > 0 for t in timed)
    # Each partition's copy of job_history_queue_status_idx is named after its partition.
    assert (
        "queue_status"
        in (data["reads_with_index"]["queue+status page of 50: q7 failed (0.03%)"]["plan"])
    )
    assert data["archive"]["with_index"]["n"] == data["archive"]["without_index"]["n"] == 300
    one_day, backlog = data["prune_one_day"], data["prune_backlog_to_7_days"]
    # 30 days evenly: the oldest day is 1/30 of the rows, days 2-23 are 22/30 of them.
    assert abs(one_day["deleted"] - 20_000 / 30) < 5
    assert abs(backlog["deleted"] - 20_000 * 22 / 30) < 5
    assert data["table_after_prune"]["rows"] == 20_000 - one_day["deleted"] - backlog["deleted"]
