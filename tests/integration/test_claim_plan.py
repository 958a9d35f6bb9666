"""The claim stays an index range scan on jobs_claim_idx, hinted or not (STYLE: SQL).

Both row comparisons must be index conditions: the lower one is where the scan starts (the
hint), the upper one where it stops (a range below the hint, claimed after a wake-up named a
job there). A bound applied as a filter would walk every dead entry past it (seed 002).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue.queries import query


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


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


CEILING = (32767, 2**63 - 1)


@pytest.mark.parametrize(
    ("hint", "stop"),
    [((-32768, 0), CEILING), ((0, 15000), CEILING), ((-1, 3000), (-1, CEILING[1]))],
    ids=["unhinted", "hinted", "range-below-the-hint"],
)
def test_claim_is_an_index_range_scan_on_the_claim_index(
    dsn: str, filled: str, hint: tuple[int, int], stop: tuple[int, int]
) -> None:
    params = {
        "queue": "default",
        "after_priority": hint[0],
        "after_id": hint[1],
        "before_priority": stop[0],
        "before_id": stop[1],
        "limit": 10,
        "worker_id": 1,
        "now": None,
    }
    claim = query("job_claim", filled)
    with psycopg.connect(dsn) as conn:
        # Force a generic plan too: what a prepared statement settles on after 5 runs.
        for mode in ("force_custom_plan", "force_generic_plan"):
            conn.execute(f"SET plan_cache_mode = {mode}")
            explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + claim
            (doc,) = conn.execute(explain, params).fetchone()  # type: ignore[misc]
            plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
            scans = [
                n
                for n in _plan_nodes(plan)
                if n.get("Relation Name") == "jobs"
                and "Scan" in n["Node Type"]
                and n.get("Index Name") != "jobs_pkey"
            ]
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
