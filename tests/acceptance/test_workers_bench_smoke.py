"""The many-workers suite (bench/workers/suite.py) as CI runs it: `--short`, 32 real worker
processes polling through a real PgBouncer, idling, then draining. The figures are the
bench's; what is checked here is what must hold at any speed: every job ran once, the
recurring job was enqueued once a second across all 32 workers (not 32 times), the workers
shared PgBouncer's server connections, and each worker's heartbeat wrote about once per
interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import pgbouncer
from tests.conftest import run_python


def test_32_workers_run_each_job_once_and_each_tick_once_through_pgbouncer(
    own_database: str, tmp_path: Path
) -> None:
    # A database of its own: the bench counts PgBouncer's server connections as the
    # database's client backends, and another test run on the same server would add to them.
    dsn = own_database
    reason = pgbouncer.unusable(dsn)
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "workers"
    result = run_python(
        "-m", "bench", "workers", "--short", "--dsn", dsn, "--out", str(out), timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    idle, drain = report["idle"], report["drain"]
    assert idle["workers"] == drain["workers"] == 32
    assert drain["ran_once"] == drain["jobs"]
    assert idle["seconds"] - 2 <= idle["recurring_ticks"] <= idle["seconds"] + 1
    assert idle["server_connections"] <= report["pool"]
    assert drain["server_connections"] <= report["pool"]
    # 32 workers beating every 5 s: about 6.4 row writes a second.
    assert 3.2 <= idle["heartbeat_writes_per_second"] <= 9.6
