"""The enqueue-scale suite (bench/enqueue_scale/suite.py) as CI runs it: `--short`, real worker
processes busy and then waiting, real client processes. The figures are the bench's;
checked here: every state and connection count was measured, busy workers were quiet (the
enqueues measured there sent no wake-up), and the idle latency was read."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_python


def test_short_enqueue_scale_bench_measures_every_state(dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "enqueue-scale"
    result = run_python(
        "-m", "bench", "enqueue-scale", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["connections"] == [1, 4]
    for state, kinds in (("busy", {"raw", "enqueue", "notify"}), ("waiting", {"raw", "enqueue"})):
        medians = report[state]["median_per_s"]
        assert set(medians) == kinds
        for kind in kinds:
            assert all(medians[kind][str(n)] > 0 for n in (1, 4)), (state, kind, medians)
    sent = report["busy"]["wake_ups_sent"]
    assert sent["enqueue"] == 0 and sent["notify"] > 0, sent  # quiet while the workers are busy
    assert report["waiting"]["wake_ups_sent"]["enqueue"] > 0  # and woken while they wait
    assert report["idle_latency"]["jobs"] == 50
    assert "idle latency" in result.stdout
