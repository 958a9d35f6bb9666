"""`pgqueue migrate --citus` on the coordinator: the migrations, then the jobs and their
history distributed by shard and colocated, the definitions a claim reads as reference tables,
unique indexes scoped to the shard; run again, nothing changes; without Citus, refused."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import citus
from pgqueue.errors import CitusUnsupportedError
from tests.acceptance.test_cli import run_pgqueue

pytestmark = pytest.mark.citus


def _tables(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, int]]:
    rows = conn.execute(
        "SELECT c.relname, p.partmethod, p.colocationid FROM pg_dist_partition AS p "
        "JOIN pg_class AS c ON c.oid = p.logicalrelid "
        "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relispartition = false",
        [schema],
    ).fetchall()
    return {name: (method, colocation) for name, method, colocation in rows}


def test_migrate_citus_distributes_jobs_and_history_by_shard_colocated(coordinator: str) -> None:
    schema = f"pgq_citus_{uuid.uuid4().hex[:10]}"
    done = run_pgqueue("migrate", "--citus", "--dsn", coordinator, "--schema", schema)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(coordinator, autocommit=True) as conn:
        tables = _tables(conn, schema)
        assert tables["jobs"][0] == "h" and tables["job_history"][0] == "h"
        assert tables["jobs"][1] == tables["job_history"][1]  # colocated
        assert tables["queue_pauses"][0] == "n"  # a reference table
        assert "workers" not in tables  # the coordinator's own
        unique = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = 'jobs' "
            "AND indexdef LIKE 'CREATE UNIQUE%%'",
            [schema],
        ).fetchall()
        assert unique and all("(shard" in row[0] for row in unique)
        again = run_pgqueue("migrate", "--citus", "--dsn", coordinator, "--schema", schema)
        assert again.returncode == 0, again.stderr
        assert "none (up to date)" in again.stderr
        assert _tables(conn, schema) == tables
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def test_migrate_citus_is_refused_where_there_is_no_citus(coordinator: str) -> None:
    name = f"pgq_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(coordinator, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    plain = coordinator.rsplit("/", 1)[0] + f"/{name}"
    try:
        with (
            psycopg.connect(plain, autocommit=True) as conn,
            pytest.raises(CitusUnsupportedError, match="no citus extension"),
        ):
            citus.migrate(conn, "pgqueue")
        done = run_pgqueue("migrate", "--citus", "--dsn", plain)
        assert done.returncode != 0 and "no citus extension" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        with psycopg.connect(coordinator, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
