"""The README's first steps, as a new user runs them, and the docker-compose.yml that runs them
with Docker (no Docker engine runs here: its file is checked as data)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from pgqueue import ConfigurationError, Queue
from tests.conftest import ROOT, env_without_dsn, run_python, wait_until

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

QUICKSTART = ROOT / "examples" / "quickstart"
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIST = PYPROJECT["project"]["name"]


def _run(*args: str, dsn: str | None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(QUICKSTART)])
    env = {"PYTHONPATH": path} | ({"PGQUEUE_DSN": dsn} if dsn else {})
    result: subprocess.CompletedProcess[str] = run_python(*args, cwd=QUICKSTART, env=env)
    return result


def test_migrate_enqueue_in_a_transaction_then_run_the_worker(own_database: str) -> None:
    migrated = _run("-m", "pgqueue", "migrate", "--dsn", own_database, dsn=own_database)
    assert migrated.returncode == 0, migrated.stderr
    placed = _run("place_order.py", "a@example.com", dsn=own_database)
    assert placed.returncode == 0, placed.stderr
    match = re.fullmatch(r"order (\d+), job (\d+)\n", placed.stdout)
    assert match, placed.stdout
    # No --dsn: the worker finds the database through PGQUEUE_DSN, as the example does.
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


def test_the_quickstart_without_a_database_says_what_to_set_and_touches_nothing() -> None:
    for args in (["place_order.py", "a@example.com"], ["-m", "pgqueue", "worker", "shop:queue"]):
        result = _run(*args, dsn=None)
        assert result.returncode == 1, result
        assert "set PGQUEUE_DSN to a database you own" in result.stderr
        assert "Traceback" not in result.stderr
        assert "embedded" not in result.stderr
    assert not (QUICKSTART / ".pgqueue").exists()


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


def test_the_slim_image_gets_a_libpq_for_psycopg() -> None:
    """python:*-slim has no libpq, and plain psycopg cannot import without one."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    install = next(line for line in dockerfile.splitlines() if line.startswith("RUN pip install"))
    assert "psycopg[binary]" in install or "libpq" in dockerfile, install


def test_the_image_copies_every_file_the_build_reads_before_it_installs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    before_install = dockerfile.split("RUN pip install")[0]
    copied = {
        path
        for line in re.findall(r"^COPY (.+) \S+$", before_install, re.M)
        for path in line.split()
    }
    project = PYPROJECT["project"]
    version_file = PYPROJECT["tool"]["hatch"]["version"]["path"]
    needed = {"pyproject.toml", project["readme"], *project["license-files"]}
    assert needed <= copied, needed - copied
    assert version_file.split("/")[0] in copied


@dataclass(frozen=True)
class Block:
    """A fenced block of the README, and the prose just before it."""

    lang: str
    code: str
    before: str


def _get_started() -> tuple[str, list[Block]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Get started\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    blocks, start = [], 0
    for found in re.finditer(r"^```(\w+)\n(.*?)^```$", section, re.MULTILINE | re.DOTALL):
        blocks.append(Block(found[1], found[2], section[start : found.start()]))
        start = found.end()
    return section, blocks


def _job_succeeded(dsn: str, job_id: int) -> bool:
    queue = Queue(dsn)
    try:
        job = queue.get_job(job_id)
    finally:
        queue.close()
    return job is not None and job.status == "succeeded"


def test_the_readmes_get_started_runs_as_written(own_database: str, tmp_path: Path) -> None:
    """Each file the steps write is written, and each command run, in a folder of its own with
    PGQUEUE_DSN set; the worker of step 5 runs while step 6 looks at it."""
    _, blocks = _get_started()
    commands: list[tuple[str, str]] = []
    for block in blocks:
        if block.lang == "python":
            paragraph = block.before.strip().split("\n\n")[-1]
            name = re.findall(r"`(\w+\.py)`", paragraph)[0]  # "say in `place_order.py`"
            (tmp_path / name).write_text(block.code)
        else:
            assert block.lang == "sh", block
            for line in block.code.splitlines():
                command, _, note = line.partition("#")
                commands.append((command.strip(), note.strip()))
    assert {path.name for path in tmp_path.iterdir()} == {"shop.py", "place_order.py"}
    setup = [command for command, _ in commands if command.startswith(("export", "pip"))]
    # This environment has the checkout installed so; the steps use the DSN given below.
    assert setup == ["export PGQUEUE_DSN=postgresql://app@localhost/app", "pip install -e '.[cli]'"]
    bin_dir = str(Path(sys.executable).parent)
    env = env_without_dsn(
        {"PGQUEUE_DSN": own_database, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    )
    env.pop("PYTHONPATH", None)
    env["COLUMNS"] = "200"
    outputs: dict[str, str] = {}
    worker: subprocess.Popen[str] | None = None
    with open(tmp_path / "worker.log", "w+") as log:
        try:
            for command, note in commands:
                if command.startswith(("export", "pip")):
                    continue
                if command.split()[:2] == ["pgqueue", "worker"]:
                    worker = subprocess.Popen(
                        f"exec {command}",
                        shell=True,
                        cwd=tmp_path,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                    wait_until(lambda: _job_succeeded(own_database, 1), what="job 1 to succeed")
                    continue
                result = subprocess.run(
                    command,
                    shell=True,
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                assert result.returncode == 0, (command, result.stdout, result.stderr)
                assert "embedded" not in result.stderr, (command, result.stderr)
                outputs[command] = result.stdout
                if command.startswith("python "):
                    assert result.stdout.strip() == note, command  # what its comment says
        finally:
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=60)
        log.seek(0)
        worker_log = log.read()
    assert worker is not None and "queues=mail" in worker_log, worker_log
    assert list(outputs) == [
        "pgqueue migrate",
        "python place_order.py",
        "pgqueue jobs show 1",
        "pgqueue workers",
        "pgqueue status",
    ]
    assert "succeeded" in outputs["pgqueue jobs show 1"]
    assert "receipt for order 1 sent to a@example.com" in outputs["pgqueue jobs show 1"]
    assert str(worker.pid) in outputs["pgqueue workers"]


def _install_texts() -> list[Path]:
    found = [
        ROOT / "README.md",
        ROOT / "Dockerfile",
        ROOT / "docker-compose.yml",
        ROOT / "Makefile",
    ]
    found += sorted((ROOT / "docs").rglob("*.md"))
    found += sorted(
        path for path in (ROOT / "examples").rglob("*") if path.suffix in (".py", ".md")
    )
    found += sorted((ROOT / "pgqueue").rglob("*.py"))
    return found


def test_the_readme_installs_the_distribution_from_a_checkout_and_names_its_index_name() -> None:
    assert DIST == "pgqueue-py"  # `pgqueue` on the package index is another project
    section, _ = _get_started()
    assert "pip install -e '.[cli]'" in section
    assert f"`pip install '{DIST}[cli]'`" in section and f"`pip install {DIST}`" in section
    assert "`embedded` extra" in section


def test_every_install_line_names_the_distribution_and_extras_it_has() -> None:
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    for path in _install_texts():
        text = path.read_text()
        assert not re.search(r"(?<![\w.-])pgqueue\[", text), path
        assert not re.search(r"pip install (?:-\S+ )*'?pgqueue(?![\w-])", text), path
        named = re.findall(rf"(?:{DIST}|\B\.)\[([\w,-]+)\]", text)
        for group in named:
            assert set(group.split(",")) <= extras, (path, group)


def test_the_installed_metadata_and_the_command_give_one_version() -> None:
    from importlib import metadata

    import pgqueue

    shown = run_python("-m", "pgqueue", "--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"pgqueue {pgqueue.__version__}\n"
    assert metadata.version(DIST) == pgqueue.__version__
    assert "version" not in PYPROJECT["project"]  # written once, in pgqueue/_version.py
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "pgqueue/_version.py"


def _docs_section(page: str, heading: str) -> str:
    """A section of a documentation page, from its heading to the next of its level."""
    text = (ROOT / "docs" / page).read_text()
    level = heading.split(" ", 1)[0]
    return text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]


def test_the_dashboard_tokens_minimum_is_written_where_a_user_sets_it() -> None:
    from pgqueue.dashboard.security import Access

    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Access(allow_actions=True, token="a" * 15)
    assert Access(allow_actions=True, token="a" * 16).guarded
    section = _docs_section("how-to/dashboard.md", "## Secure it")
    assert "`PGQUEUE_DASHBOARD_TOKEN`, at least 16 characters" in section
    assert "at least 16 characters" in (Access.__doc__ or "")


def test_the_celery_sink_says_a_redis_broker_needs_celery_redis() -> None:
    import pgqueue.relay.sinks.celery

    (row,) = [
        line
        for line in _docs_section("how-to/outbox-relay.md", "## The sinks").splitlines()
        if "CelerySink" in line
    ]
    assert "`celery[redis]` for a Redis broker" in row
    assert "pip install 'celery[redis]'" in (pgqueue.relay.sinks.celery.__doc__ or "")
