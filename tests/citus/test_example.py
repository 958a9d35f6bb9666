"""examples/citus as a user runs it, on the suite's cluster: orders distributed by tenant,
each shipped by a job enqueued with it, two worker processes."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from tests.conftest import ROOT, run_python

pytestmark = pytest.mark.citus


def test_the_citus_shop_ships_what_committed(coordinator: str) -> None:
    schema = f"shop_{uuid.uuid4().hex[:8]}"
    folder = ROOT / "examples" / "citus"
    try:
        ran = run_python(
            "shop.py",
            cwd=folder,
            env={"CITUS_DSN": coordinator, "SHOP_SCHEMA": schema, "PYTHONPATH": str(ROOT)},
            timeout=240,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout.splitlines() == ["acme: shipped anvil, rocket", "globex: shipped lamp"]
    finally:
        with psycopg.connect(coordinator, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
