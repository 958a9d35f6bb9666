"""EXPLAIN a statement as the server would run it: planned for its values, or as the generic
plan a prepared statement settles on; and the outcome rows that finish jobs. Used by the
benches and by the plan tests.

EXPLAIN of a statement sent with bound parameters always plans for those values, whatever
plan_cache_mode says, so the generic plan is taken from a PREPAREd copy instead.
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.store.jobs import finish_rows_params


def generic_plan(
    conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any], *, analyze: bool = False
) -> Any:
    """EXPLAIN of `statement` as the generic plan a prepared statement settles on; with
    `analyze`, run (EXPLAIN ANALYZE, with buffers: the caller rolls back what it wrote).

    PostgreSQL 15 has no EXPLAIN (GENERIC_PLAN): the statement is PREPAREd with $n
    parameters and EXPLAIN EXECUTE runs under plan_cache_mode = force_generic_plan. (EXPLAIN
    of a statement sent with bound parameters would plan it for those values.)"""
    text = statement.as_string(conn)
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
    body = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m[1]) + 1}", text)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(sql.SQL("PREPARE plans_explained AS {}").format(sql.SQL(body.replace("%%", "%"))))
    try:
        args = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
        options = sql.SQL("ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON")
        explain = sql.SQL("EXPLAIN ({}) EXECUTE plans_explained({})").format(options, args)
        doc = conn.execute(explain).fetchone()[0]  # type: ignore[index]
    finally:
        conn.execute("DEALLOCATE plans_explained")
        conn.execute("RESET plan_cache_mode")
    return (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]


def custom_plan(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> Any:
    """EXPLAIN of `statement` planned for these parameter values (a custom plan)."""
    doc = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + statement, params).fetchone()[0]  # type: ignore[index]
    return (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a plan, depth first."""
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(plan_nodes(child))
    return nodes


def own_buffers(plan: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """Every node of a plan with the shared buffers it touched itself: its count less its
    children's. A CTE's plan hangs under the statement's top node (an InitPlan named "CTE
    x"): it runs when a CTE Scan first reads it, inside that scan's count, or after the rest
    of the statement if nothing reads it (a data-modifying CTE), outside every other node's.
    So a CTE Scan counts nothing of its own, the CTE's nodes count its work, and the sum of
    all is the statement's, where the top node's count leaves the unread CTEs out."""
    found: list[tuple[dict[str, Any], int]] = []
    children = plan.get("Plans", [])
    inline = [p for p in children if not str(p.get("Subplan Name", "")).startswith("CTE ")]
    own = _buffers(plan) - sum(_buffers(p) for p in inline)
    found.append((plan, 0 if plan.get("Node Type") == "CTE Scan" else own))
    for child in children:
        found.extend(own_buffers(child))
    return found


def _buffers(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def succeeded(ids: list[int], worker_id: int = 1) -> dict[str, object]:
    """job_finish_many's parameters: each job succeeded at its first attempt."""
    return finish_rows_params(
        [
            {
                "id": i,
                "attempt": 1,
                "worker_id": worker_id,
                "status": "succeeded",
                "error": None,
                "result": None,
                "duration": 0.001,
                "retry_in": None,
            }
            for i in ids
        ]
    )
