"""A built wheel is complete: it carries the SQL, and once installed away from the checkout it
imports, finds its own sql/ folder, and migrates a database.

The installed copy runs from a directory outside the repository, so the checkout's sql/ and
pgqueue/ cannot stand in for what the wheel should carry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ROOT, drop_schema

MIGRATION_FILES = sorted((ROOT / "sql" / "migrations").glob("*.sql"))

INSPECT = """
import json, pgqueue, pgqueue.queries
print(json.dumps({
    "file": pgqueue.__file__,
    "sql_root": str(pgqueue.queries.sql_root()),
    "migrations": [f"{m.version:04d}_{m.name}" for m in pgqueue.queries.migrations()],
}))
"""


@dataclass(frozen=True)
class Installed:
    wheel: Path
    site: Path
    outside: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`python ARGS` that imports pgqueue from the installed wheel only."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PGQUEUE_DSN", "DATABASE_URL", "PYTHONPATH")
        }
        env["PYTHONPATH"] = str(self.site)
        return subprocess.run(
            [sys.executable, *args],
            cwd=self.outside,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel built from the checkout, installed into a private target directory."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheels = list(dist.glob("pgqueue-*.whl"))
    assert len(wheels) == 1, wheels
    site = base / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--target",
            str(site),
            str(wheels[0]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    outside = base / "elsewhere"
    outside.mkdir()
    return Installed(wheels[0], site, outside)


@pytest.fixture
def fresh_schema_name(dsn: str) -> Iterator[str]:
    """A schema name nobody has created yet; dropped after the test whatever created it."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(dsn, name)


def test_wheel_carries_migrations_queries_and_py_typed(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())

    assert "pgqueue/sql/migrations/0001_jobs.sql" in names
    assert "pgqueue/sql/queries/jobs.sql" in names
    assert "pgqueue/py.typed" in names
    for path in (ROOT / "sql").rglob("*.sql"):
        assert f"pgqueue/sql/{path.relative_to(ROOT / 'sql').as_posix()}" in names


def test_installed_wheel_imports_from_its_target_and_reads_its_own_sql(
    installed: Installed,
) -> None:
    result = installed.run("-c", INSPECT)

    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    package = (installed.site / "pgqueue").resolve()
    assert Path(found["file"]).resolve() == package / "__init__.py"
    assert Path(found["sql_root"]).resolve() == package / "sql"
    assert found["migrations"] == [path.stem for path in MIGRATION_FILES]


def test_installed_wheel_migrates_a_fresh_schema_from_outside_the_checkout(
    installed: Installed, dsn: str, fresh_schema_name: str
) -> None:
    result = installed.run("-m", "pgqueue", "migrate", "--dsn", dsn, "--schema", fresh_schema_name)

    assert result.returncode == 0, result.stderr
    assert f"schema {fresh_schema_name}: applied 0001_jobs" in result.stderr
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s",
            [fresh_schema_name],
        ).fetchall()
    assert {"jobs", "job_history", "workers", "migrations"} <= {row[0] for row in rows}
