"""What `python -m build` makes is complete: the sdist and the wheel carry every SQL file,
template and static file, with the package's metadata; and the wheel, installed with its
dependencies into a clean virtualenv, runs `pgqueue --version`, the quickstart and `pgqueue
demo` against a real PostgreSQL.

Every installed command runs from a directory outside the repository, with no PYTHONPATH, so the
checkout's sql/ and pgqueue/ cannot stand in for what the wheel should carry. The build is
isolated (its own hatchling, as a user's pip builds it), and the wheel is built from the sdist,
so a file the sdist leaves out is missing from the wheel too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from email.parser import Parser
from pathlib import Path

import psycopg
import pytest

import pgqueue
from tests.conftest import ROOT, drop_schema

MIGRATION_FILES = sorted((ROOT / "sql" / "migrations").glob("*.sql"))
DIST = "pgqueue-py"

INSPECT = """
import json, pgqueue, pgqueue.queries
print(json.dumps({
    "file": pgqueue.__file__,
    "sql_root": str(pgqueue.queries.sql_root()),
    "migrations": [f"{m.version:04d}_{m.name}" for m in pgqueue.queries.migrations()],
}))
"""


def _packaged_data() -> list[str]:
    """Every file the package reads at run time, as its path inside the wheel."""
    sql_files = [f"pgqueue/sql/{p.relative_to(ROOT / 'sql').as_posix()}" for p in _files("sql")]
    dashboard = [
        p.relative_to(ROOT).as_posix()
        for folder in ("pgqueue/dashboard/templates", "pgqueue/dashboard/static")
        for p in _files(folder)
    ]
    return sorted([*sql_files, *dashboard, "pgqueue/py.typed"])


def _files(folder: str) -> list[Path]:
    found = sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    assert found, folder
    return found


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    venv: Path
    outside: Path

    def run(
        self, command: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The virtualenv's `command ARGS`, with no DSN and no PYTHONPATH inherited."""
        clean = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PGQUEUE_DSN", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")
        }
        return subprocess.run(
            [str(self.venv / "bin" / command), *args],
            cwd=cwd or self.outside,
            env=clean | (env or {}),
            capture_output=True,
            text=True,
            timeout=120,
        )


def _check(*args: str, cwd: Path = ROOT) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """`python -m build` of the checkout, and its wheel installed with the cli extra's
    dependencies into a new virtualenv."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    _check(sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT))
    (wheel,) = dist.glob("pgqueue_py-*.whl")
    (sdist,) = dist.glob("pgqueue_py-*.tar.gz")
    venv = base / "venv"
    _check(sys.executable, "-m", "venv", str(venv), cwd=base)
    _check(str(venv / "bin" / "pip"), "install", "--quiet", f"{wheel}[cli]", cwd=base)
    outside = base / "elsewhere"
    outside.mkdir()
    return Installed(wheel, sdist, venv, outside)


@pytest.fixture
def fresh_schema_name(dsn: str) -> Iterator[str]:
    """A schema name nobody has created yet; dropped after the test whatever created it."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(dsn, name)


def test_the_wheel_carries_every_sql_template_and_static_file(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())

    assert "pgqueue/sql/migrations/0001_jobs.sql" in names
    assert "pgqueue/dashboard/templates/base.html" in names
    assert [path for path in _packaged_data() if path not in names] == []


def test_the_sdist_carries_the_sources_sql_examples_and_license(installed: Installed) -> None:
    with tarfile.open(installed.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}

    expected = [p.relative_to(ROOT).as_posix() for p in _files("sql")]
    expected += [p.relative_to(ROOT).as_posix() for p in _files("examples/quickstart")]
    expected += ["LICENSE", "README.md", "pyproject.toml", "pgqueue/_version.py"]
    expected += [path for path in _packaged_data() if not path.startswith("pgqueue/sql/")]
    assert [path for path in expected if path not in names] == []
    assert "bench/README.md" not in names


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


def test_the_wheels_metadata_names_the_distribution_its_license_and_postgresql(
    installed: Installed,
) -> None:
    meta = _metadata(installed.wheel)

    assert meta["Name"] == DIST
    assert meta["Version"] == pgqueue.__version__
    assert "PostgreSQL 15 or newer" in meta["Summary"]
    assert meta["License-Expression"] == "MIT"
    assert meta["License-File"] == "LICENSE"
    assert meta["Requires-Python"] == ">=3.10"
    assert "postgresql" in meta["Keywords"].split(",")
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Topic :: Database" in classifiers
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"cli", "embedded", "dashboard", "celery", "redis"} <= extras
    # The long description is the README, whose install line names this distribution.
    assert f"pip install '{DIST}[cli]'" in meta.get_payload()


def test_the_installed_command_prints_the_version_written_once(installed: Installed) -> None:
    shown = installed.run("pgqueue", "--version")
    distribution = installed.run(
        "python", "-c", f"from importlib import metadata; print(metadata.version({DIST!r}))"
    )

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"pgqueue {pgqueue.__version__}\n"
    assert distribution.stdout == f"{pgqueue.__version__}\n"


def test_installed_wheel_imports_from_its_virtualenv_and_reads_its_own_sql(
    installed: Installed,
) -> None:
    result = installed.run("python", "-c", INSPECT)

    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    (package,) = (installed.venv / "lib").glob("python3*/site-packages/pgqueue")
    assert Path(found["file"]).resolve() == package.resolve() / "__init__.py"
    assert Path(found["sql_root"]).resolve() == package.resolve() / "sql"
    assert found["migrations"] == [path.stem for path in MIGRATION_FILES]


def test_installed_wheel_migrates_a_fresh_schema_from_outside_the_checkout(
    installed: Installed, dsn: str, fresh_schema_name: str
) -> None:
    result = installed.run("pgqueue", "migrate", "--dsn", dsn, "--schema", fresh_schema_name)

    assert result.returncode == 0, result.stderr
    assert f"schema {fresh_schema_name}: applied 0001_jobs" in result.stderr
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s",
            [fresh_schema_name],
        ).fetchall()
    assert {"jobs", "job_history", "workers", "migrations"} <= {row[0] for row in rows}


def test_installed_wheel_runs_the_quickstart_against_postgresql(
    installed: Installed, own_database: str
) -> None:
    app = installed.outside / f"quickstart-{uuid.uuid4().hex[:8]}"
    shutil.copytree(ROOT / "examples" / "quickstart", app)
    env = {"PGQUEUE_DSN": own_database}

    migrated = installed.run("pgqueue", "migrate", env=env, cwd=app)
    assert migrated.returncode == 0, migrated.stderr
    placed = installed.run("python", "place_order.py", "a@example.com", env=env, cwd=app)
    assert placed.returncode == 0, placed.stderr
    match = re.fullmatch(r"order (\d+), job (\d+)\n", placed.stdout)
    assert match, placed.stdout
    worked = installed.run(
        "pgqueue", "worker", "shop:queue", "--queues", "all", "--burst", env=env, cwd=app
    )
    assert worked.returncode == 0, worked.stderr
    shown = installed.run("pgqueue", "jobs", "show", match[2], "--json", env=env, cwd=app)
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["status"] == "succeeded"
    assert job["result"] == f"receipt for order {match[1]} sent to a@example.com"
    for result in (migrated, placed, worked, shown):
        assert "embedded" not in result.stderr


def test_installed_wheel_runs_the_demo_against_postgresql(
    installed: Installed, own_database: str
) -> None:
    shown = installed.run("pgqueue", "demo", "--jobs", "200", env={"PGQUEUE_DSN": own_database})
    assert shown.returncode == 0, shown.stderr
    assert "jobs that ran:                          200 of 200" in shown.stdout, shown.stdout
    assert "jobs from rolled-back transactions run: 0 (must be 0)" in shown.stdout
    assert "jobs that ran twice:                    0 (must be 0)" in shown.stdout
    assert "embedded" not in shown.stderr
