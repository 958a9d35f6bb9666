"""The claim stays an index range scan on jobs_claim_idx, hinted or not (STYLE: SQL).

Both row comparisons must be index conditions: the lower one is where the scan starts (the
hint), the upper one where it stops (a range below the hint, claimed after a wake-up named a
job there). A bound applied as a filter would walk every dead entry past it.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import custom_plan, generic_plan, plan_nodes
from pgqueue.queries import query
from tests.conftest import CEILING, FLOOR, claim_params

# Run on each server CI tests against: the claim's plan is the server's planner's.
pytestmark = pytest.mark.each_server


@pytest.fixture
def filled(dsn: str, schema: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, priority, status, run_at) "
                "SELECT CASE WHEN g % 10 = 0 THEN 'other' ELSE 'default' END, 't', '{{}}', "
                "(g % 3) - 1, CASE WHEN g % 7 = 0 THEN 'scheduled' ELSE 'queued' END, "
                "now() + CASE WHEN g % 7 = 0 THEN interval '1 hour' ELSE interval '0' END "
                "FROM generate_series(1, 20000) AS g"
            ).format(table)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(table))
    return schema


@pytest.mark.parametrize("statement", ["job_claim", "job_claim_unkeyed"])
@pytest.mark.parametrize(
    ("hint", "stop"),
    [(FLOOR, CEILING), ((0, 15000), CEILING), ((-1, 3000), (-1, CEILING[1]))],
    ids=["unhinted", "hinted", "range-below-the-hint"],
)
def test_claim_is_an_index_range_scan_on_the_claim_index(
    dsn: str, filled: str, hint: tuple[int, int], stop: tuple[int, int], statement: str
) -> None:
    params = claim_params(after=hint, before=stop)
    claim = query(statement, filled)
    with psycopg.connect(dsn) as conn:
        # The generic plan too: what a prepared statement may settle on after 5 runs.
        for mode, explain in (("custom", custom_plan), ("generic", generic_plan)):
            plan = explain(conn, claim, params)
            on_jobs = [
                n
                for n in plan_nodes(plan)
                if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
            ]
            # The keyed CTEs (concurrency keys) read jobs only through indexes too.
            assert all("Index" in n["Node Type"] for n in on_jobs), json.dumps(plan, indent=1)
            scans = [n for n in on_jobs if n.get("Index Name") == "jobs_claim_idx"]
            assert len(scans) == 1, json.dumps(plan, indent=1)
            scan = scans[0]
            assert scan["Node Type"] == "Index Scan", (mode, scan["Node Type"])
            assert scan["Index Name"] == "jobs_claim_idx"
            cond = scan.get("Index Cond", "")
            assert "queue =" in cond and "ROW(priority, id) >" in cond, (mode, cond)
            assert "ROW(priority, id) <" in cond, (mode, cond)
            # FOR UPDATE keeps the partial index's predicate as a recheck of the locked row
            # (that recheck is what stops a double claim); nothing else may be filtered.
            predicate = "((NOT atomic) AND (status = 'queued'::text))"
            assert scan.get("Filter", predicate) == predicate, (mode, scan.get("Filter"))
        conn.rollback()


def test_keyed_claim_parks_a_saturated_keys_jobs_through_the_keyed_index(
    dsn: str, schema: str
) -> None:
    """With limit keys, the claim still starts on jobs_claim_idx and parks a saturated
    key's other jobs through jobs_keyed_queued_idx (the concurrency_key) and
    jobs_limit_keys_queued_idx (more keys): no statement of the claim scans jobs. The
    admission and parking run in concurrency_admit and concurrency_park (migrations 0006,
    0029), whose statements auto_explain reports."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, concurrency_key, limit_keys) "
                "SELECT 'default', 't', '{{}}', CASE WHEN g % 3 = 0 THEN NULL "
                "ELSE 'k' || (g % 5) END, "
                "CASE WHEN g % 4 = 1 THEN ARRAY['u' || (g % 7)] END "
                "FROM generate_series(1, 20000) AS g"
            ).format(table)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(table))
        conn.execute(
            sql.SQL("INSERT INTO {}.concurrency_limits VALUES ('*', 1)").format(
                sql.Identifier(schema)
            )
        )
    params = claim_params(limit=100)
    notices: list[str] = []
    with psycopg.connect(dsn) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for mode in ("force_custom_plan", "force_generic_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            for setting, value in AUTO_EXPLAIN.items():
                conn.execute(f"SET auto_explain.{setting} = {value}")
            conn.execute("SET client_min_messages = log")
            notices.clear()
            explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + query("job_claim", schema)
            (doc,) = conn.execute(explain, params).fetchone()  # type: ignore[misc]
            plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
            nested = [_logged_plan(m) for m in notices if "unnest(saturated)" in m]
            assert len(nested) == 2, notices  # each parking statement ran once
            inner = [_logged_plan(m) for m in notices if "plan:" in m and "job_keys" in m]
            assert inner, notices  # the admission's own statements
            nodes = [n for p in [plan, *nested, *inner] for n in plan_nodes(p)]
            on_jobs = [
                n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
            ]
            assert all(n["Node Type"] != "Seq Scan" for n in on_jobs), json.dumps(nested, indent=1)
            used = {n.get("Index Name") for n in nodes if "Index" in n["Node Type"]}
            parked = [n for n in nodes if n.get("Index Name") == "jobs_keyed_queued_idx"]
            assert parked and parked[0]["Actual Rows"] > 0  # the saturated keys' rest parked
            more = [n for n in nodes if n.get("Index Name") == "jobs_limit_keys_queued_idx"]
            assert more and more[0]["Actual Rows"] > 0
            assert {"jobs_claim_idx", "jobs_keyed_queued_idx"} <= used, used
            conn.rollback()


AUTO_EXPLAIN = {
    "log_min_duration": "0",
    "log_nested_statements": "on",
    "log_analyze": "on",
    "log_format": "json",
}


def _logged_plan(message: str) -> dict[str, Any]:
    """The plan in an auto_explain message: 'duration: ... ms  plan:' then the JSON."""
    plan: dict[str, Any] = json.loads(message.split("\n", 1)[1])["Plan"]
    return plan


def test_keyed_claim_from_the_floor_stays_under_the_jit_threshold_with_a_big_backlog(
    dsn: str, schema: str
) -> None:
    """One key with 50,000 queued jobs: the claim is not costed for parking them (that is
    concurrency_park's own statement), so PostgreSQL does not JIT-compile every claim. Parked
    inline, this claim was costed at about 212,000, over the default jit_above_cost of 100,000,
    and took 115-300 ms on PostgreSQL 15 instead of a few (migration 0006)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, concurrency_key) "
                "SELECT 'default', 't', '{{}}', 'big' FROM generate_series(1, 50000)"
            ).format(table)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(table))
        limits = sql.SQL("INSERT INTO {}.concurrency_limits VALUES ('*', 1000)")
        conn.execute(limits.format(sql.Identifier(schema)))
        params = claim_params(limit=100)
        explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + query("job_claim", schema)
        (doc,) = conn.execute(explain, params).fetchone()  # type: ignore[misc]
        cost = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]["Total Cost"]
    assert cost < 100_000, cost


@pytest.mark.parametrize("hint", [(-32768, float("-inf")), (0, 500.0)], ids=["floor", "hinted"])
def test_fair_claim_is_an_index_range_scan_on_the_fair_claim_index(
    dsn: str, schema: str, hint: tuple[int, float]
) -> None:
    """job_claim_fair walks jobs_fair_claim_idx from its (priority, vtime) hint, a start
    bound, whatever the plan: dead entries below the hint are never visited."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, priority, fairness_key, vtime) "
                "SELECT 'default', 't', '{{}}', (g % 3) - 1, "
                "CASE WHEN g % 4 = 0 THEN NULL ELSE 'k' || (g % 50) END, "
                "CASE WHEN g % 4 = 0 THEN NULL ELSE g / 10.0 END "
                "FROM generate_series(1, 20000) AS g"
            ).format(table)
        )
        conn.execute(sql.SQL("ANALYZE {}").format(table))
    params = {
        "queue": "default",
        "after_priority": hint[0],
        "after_vtime": hint[1],
        "before_priority": 32767,
        "before_vtime": float("inf"),
        "limit": 10,
        "worker_id": 1,
        "now": None,
    }
    claim = query("job_claim_fair", schema)
    with psycopg.connect(dsn) as conn:
        for mode, explain in (("custom", custom_plan), ("generic", generic_plan)):
            plan = explain(conn, claim, params)
            on_jobs = [
                n
                for n in plan_nodes(plan)
                if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
            ]
            assert all("Index" in n["Node Type"] for n in on_jobs), json.dumps(plan, indent=1)
            scans = [n for n in on_jobs if n.get("Index Name") == "jobs_fair_claim_idx"]
            assert len(scans) == 1, json.dumps(plan, indent=1)
            cond = scans[0].get("Index Cond", "")
            assert "queue =" in cond and "ROW(priority, vtime) >=" in cond, (mode, cond)
        conn.rollback()
