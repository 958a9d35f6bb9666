"""The README's first steps, as a new user runs them, and the docker-compose.yml that runs them
with Docker (no Docker engine runs here: its file is checked as data)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pgqueue import Queue
from tests.conftest import ROOT, run_python

QUICKSTART = ROOT / "examples" / "quickstart"


def _run(*args: str, dsn: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(QUICKSTART)])
    result: subprocess.CompletedProcess[str] = run_python(
        *args, cwd=QUICKSTART, env={"SHOP_DSN": dsn, "PYTHONPATH": path}
    )
    return result


def test_migrate_enqueue_in_a_transaction_then_run_the_worker(own_database: str) -> None:
    migrated = _run("-m", "pgqueue", "migrate", "--dsn", own_database, dsn=own_database)
    assert migrated.returncode == 0, migrated.stderr
    placed = _run("place_order.py", "a@example.com", dsn=own_database)
    assert placed.returncode == 0, placed.stderr
    match = re.fullmatch(r"order (\d+), job (\d+)\n", placed.stdout)
    assert match, placed.stdout
    # No --dsn: the worker takes the DSN the application gave its Queue.
    worked = _run(
        "-m", "pgqueue", "worker", "shop:queue", "--queues", "all", "--burst", dsn=own_database
    )
    assert worked.returncode == 0, worked.stderr
    assert "embedded" not in worked.stderr
    queue = Queue(own_database)
    job = queue.get_job(int(match[2]))
    queue.close()
    assert job is not None and job.status == "succeeded"
    assert job.result == f"receipt for order {match[1]} sent to a@example.com"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_compose_runs_postgres_on_a_free_port_a_migration_and_a_worker() -> None:
    services = _compose()["services"]
    assert set(services) == {"postgres", "migrate", "worker"}
    assert services["postgres"]["ports"] == ["127.0.0.1:${PGQUEUE_PG_PORT:-55432}:5432"]
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    worker = services["worker"]
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert worker["command"][:3] == ["pgqueue", "worker", "shop:queue"]
    for name in ("migrate", "worker"):
        dsn = services[name]["environment"]["PGQUEUE_DSN"]
        assert "@postgres:5432/" in dsn, dsn  # the compose network's server, not the host's


def test_the_image_the_compose_file_builds_copies_what_exists() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), path
    assert 'CMD ["pgqueue", "worker", "shop:queue", "--queues", "all"]' in dockerfile
    assert (Path(QUICKSTART) / "shop.py").exists()
