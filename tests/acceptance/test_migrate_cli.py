"""`pgqueue migrate` as a real process: creates the tables once, is a no-op the second time,
prints without applying under --sql, and is safe when several processes run it at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.conftest import ROOT, drop_schema

# Run on each server CI tests against: every migration runs on each server.
pytestmark = pytest.mark.each_server

TABLES = {"jobs", "job_history", "workers", "migrations"}
MIGRATION_FILES = sorted((ROOT / "sql" / "migrations").glob("*.sql"))


def cli_env() -> dict[str, str]:
    """The caller's environment without a DSN, so only --dsn selects the server."""
    return {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}


def migrate_command(dsn: str, schema: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pgqueue", "migrate", "--dsn", dsn, "--schema", schema, *args]


def run_migrate(dsn: str, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        migrate_command(dsn, schema, *args),
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def tables(dsn: str, schema: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", [schema]
        ).fetchall()
    return {row[0] for row in rows}


def migration_rows(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT version, name, applied_at FROM {}.migrations ORDER BY version")
        return conn.execute(query.format(sql.Identifier(schema))).fetchall()


@pytest.fixture
def fresh_schema_name(dsn: str) -> Iterator[str]:
    """A schema name nobody has created yet; dropped after the test whatever created it."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(dsn, name)


def test_migrate_creates_the_pgqueue_tables_in_a_fresh_schema(
    dsn: str, fresh_schema_name: str
) -> None:
    result = run_migrate(dsn, fresh_schema_name)

    assert result.returncode == 0, result.stderr
    assert f"schema {fresh_schema_name}: applied 0001_jobs" in result.stderr
    assert tables(dsn, fresh_schema_name) >= TABLES


def test_migrate_twice_applies_nothing_and_leaves_migrations_table_unchanged(
    dsn: str, fresh_schema_name: str
) -> None:
    first = run_migrate(dsn, fresh_schema_name)
    assert first.returncode == 0, first.stderr
    before = migration_rows(dsn, fresh_schema_name)

    second = run_migrate(dsn, fresh_schema_name)

    assert second.returncode == 0, second.stderr
    assert "applied none (up to date)" in second.stderr
    assert migration_rows(dsn, fresh_schema_name) == before


def test_migrate_sql_prints_the_schema_sql_and_creates_nothing(
    dsn: str, fresh_schema_name: str
) -> None:
    result = run_migrate(dsn, fresh_schema_name, "--sql")

    assert result.returncode == 0, result.stderr
    assert f'CREATE TABLE "{fresh_schema_name}".jobs' in result.stdout
    assert f'CREATE TABLE "{fresh_schema_name}".job_history' in result.stdout
    assert tables(dsn, fresh_schema_name) == set()
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", [fresh_schema_name]
        ).fetchone()
    assert found == (0,)


def test_migrate_sql_on_an_up_to_date_schema_prints_nothing(dsn: str, schema: str) -> None:
    result = run_migrate(dsn, schema, "--sql")

    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def test_four_migrate_processes_at_once_apply_each_migration_exactly_once(
    dsn: str, fresh_schema_name: str
) -> None:
    procs = [
        subprocess.Popen(
            migrate_command(dsn, fresh_schema_name),
            cwd=ROOT,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    for proc, (_, stderr) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, stderr
    rows = [(version, name) for version, name, _ in migration_rows(dsn, fresh_schema_name)]
    assert rows == [(int(path.stem[:4]), path.stem[5:]) for path in MIGRATION_FILES]
    appliers = [stderr for _, stderr in outputs if "up to date" not in stderr]
    assert len(appliers) == 1, outputs
    assert tables(dsn, fresh_schema_name) >= TABLES


def test_migrate_with_an_app_writes_its_task_declarations_for_sql_enqueues(
    dsn: str, fresh_schema_name: str
) -> None:
    first = run_migrate(dsn, fresh_schema_name, "--app", "tests.apps.tasks:queue")
    assert first.returncode == 0, first.stderr
    assert "task declarations written" in first.stderr and "stall_once" in first.stderr
    with psycopg.connect(dsn) as conn:
        query = sql.SQL("SELECT queue, max_attempts FROM {}.tasks WHERE name = 'stall_once'")
        assert conn.execute(query.format(sql.Identifier(fresh_schema_name))).fetchall() == [
            ("default", 3)
        ]

    again = run_migrate(dsn, fresh_schema_name, "--app", "tests.apps.tasks:queue")
    assert again.returncode == 0, again.stderr
    assert "task declarations written none (up to date)" in again.stderr
