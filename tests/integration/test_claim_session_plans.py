"""The claim connection runs its statements on their generic plans (session_generic_plans in
sql/queries/workers.sql), so each of them must read jobs on its generic plan as it does on a
plan made for its values (STYLE: SQL).

A generic plan is costed without the values: a LIMIT that is a parameter reads as a tenth of
the rows, a range bound as a third. A statement whose generic plan changed shape (a sort of
every queued job, a walk of the whole primary key) would cost that at every call. The table
holds every state a claim connection reads, in proportions that make such a plan tempting.
test_claim_plan.py checks the claims' index conditions in detail.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import custom_plan, generic_plan, plan_nodes
from pgqueue.queries import query

# Run on each server CI tests against: the claim's plan is the server's planner's.
pytestmark = pytest.mark.each_server

# The statements the claim connection prepares that read jobs (Claimer, FetchLoop, Rescuer).
STATEMENTS = [
    "job_claim",
    "job_claim_unkeyed",
    "job_claim_rated",
    "job_claim_fair",
    "job_promote_due",
    "job_release_many",
    "job_release_orphans",
    "job_find_stranded",
    "job_find_orphaned",
    "job_find_of_workers",
    "job_sweep_find",
    "job_list_cancel_requested",
    "job_fail_out_of_range",
]


@pytest.fixture
def mixed(dsn: str, schema: str) -> dict[str, Any]:
    """60,000 jobs: queued at three priorities in two queues, scheduled, and running for 20
    workers; analysed. Returns the statements' parameters."""
    name = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency) "
                "SELECT 'w' || g, 'h', g, '{{default}}', 10 FROM generate_series(1, 20) AS g"
            ).format(name)
        )
        row = conn.execute(sql.SQL("SELECT min(id) FROM {}.workers").format(name)).fetchone()
        assert row is not None
        first_worker = int(row[0])
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, priority, status, run_at, worker_id, "
                "started_at, attempt) "
                "SELECT CASE WHEN g % 10 = 0 THEN 'other' ELSE 'default' END, 't', '{{}}', "
                "(g % 3) - 1, "
                "CASE WHEN g % 7 = 0 THEN 'scheduled' WHEN g % 5 = 0 THEN 'running' "
                "ELSE 'queued' END, "
                "now() + CASE WHEN g % 7 = 0 THEN interval '1 hour' ELSE interval '0' END, "
                "CASE WHEN g % 7 <> 0 AND g % 5 = 0 THEN {} + g % 20 END, "
                "CASE WHEN g % 7 <> 0 AND g % 5 = 0 THEN now() END, "
                "CASE WHEN g % 7 <> 0 AND g % 5 = 0 THEN 1 ELSE 0 END "
                "FROM generate_series(1, 60000) AS g"
            ).format(name, sql.Literal(first_worker))
        )
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(name))
        conn.execute(sql.SQL("ANALYZE {}.workers").format(name))
    return {
        "queue": "default",
        "queues": ["default"],
        "after_priority": -32768,
        "after_id": 0,
        "after_vtime": 0,
        "before_vtime": float("inf"),
        "before_priority": 32767,
        "before_id": 2**62,
        "limit": 100,
        "limited_tasks": [],
        "job_limits": False,
        "start_margin": "1 second",
        "now": None,
        "worker_id": first_worker,
        "workers": [first_worker, first_worker + 1],
        "ids": [1, 2, 3],
        "known": [1, 2],
        "lease": 30.0,
        "keep_history": True,
        "lo": "(0,0)",
        "hi": "(100,0)",
        "hint_priority": 0,
        "hint_id": 2**62,
    }


def _reads_of_jobs(plan: dict[str, Any]) -> list[str]:
    """How a plan reads jobs: each scan's type and index, in order."""
    return [
        f"{n['Node Type']} {n.get('Index Name', '')}".strip()
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    ]


@pytest.mark.parametrize("name", STATEMENTS)
def test_a_claim_connection_statement_reads_jobs_alike_on_its_generic_plan(
    dsn: str, schema: str, mixed: dict[str, Any], name: str
) -> None:
    statement = query(name, schema)
    with psycopg.connect(dsn) as conn:
        # As the claim connection plans (session_prefer_indexes).
        conn.execute("SELECT set_config('enable_seqscan', 'off', false)")
        custom = custom_plan(conn, statement, mixed)
        generic = generic_plan(conn, statement, mixed)
        conn.rollback()
    assert _reads_of_jobs(custom), json.dumps(custom, indent=1)  # it does read jobs
    assert _reads_of_jobs(generic) == _reads_of_jobs(custom), json.dumps(generic, indent=1)
    assert "Seq Scan" not in _reads_of_jobs(generic)


# The plain claims walk from the hint: what they pass is test_hint.py's and the walks tool's.
PICKED_BY_KEY = [
    n for n in STATEMENTS if n not in ("job_claim", "job_claim_unkeyed", "job_claim_rated")
]


@pytest.mark.parametrize("name", PICKED_BY_KEY)
def test_a_claim_connection_statement_reads_no_dead_entries_it_does_not_need(
    dsn: str, schema: str, name: str
) -> None:
    # Statistics taken (by autovacuum, here by hand) while the table held one live job, and a
    # held snapshot keeping the dead entries of many more. A generic plan that joined an
    # update to the jobs it picked by walking the whole primary key (one row, by the
    # statistics) read every dead entry at each call, as promotion did. These parameters
    # give each statement its narrowest range.
    table = sql.Identifier(schema)
    insert = sql.SQL(
        "INSERT INTO {}.jobs (queue, task, args) SELECT 'default', 't', '{{}}'"
        " FROM generate_series(1, %s)"
    ).format(table)
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn) as holder,
    ):
        conn.execute(insert, [1])
        row = conn.execute(sql.SQL("SELECT max(id) FROM {}.jobs").format(table)).fetchone()
        assert row is not None
        live = int(row[0])
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")
        conn.execute(insert, [30_000])
        conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE id > %s").format(table), [live])
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}.jobs").format(table))
        conn.execute("SELECT set_config('enable_seqscan', 'off', false)")
        params = {**NARROW, "after_id": live, "hint_id": live + 1, "before_id": live + 1}
        with conn.transaction(force_rollback=True):
            plan = generic_plan(conn, query(name, schema), params, analyze=True)
        holder.rollback()
    scans = [
        n for n in plan_nodes(plan) if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    ]
    assert scans, json.dumps(plan, indent=1)  # it does read jobs
    # The scans' own reads (a function's, of other tables, are not the point here).
    read = sum(int(n["Shared Hit Blocks"]) + int(n["Shared Read Blocks"]) for n in scans)
    assert read < 100, json.dumps(plan, indent=1)


NARROW: dict[str, Any] = {
    "queue": "default",
    "queues": ["default"],
    "after_priority": 0,
    "after_vtime": 0,
    "before_vtime": 0,
    "before_priority": 0,
    "limit": 100,
    "limited_tasks": [],
    "job_limits": False,
    "start_margin": "1 second",
    "now": None,
    "worker_id": 0,
    "workers": [0],
    "ids": [1],
    "known": [1],
    "lease": 30.0,
    "keep_history": True,
    "lo": "(0,0)",
    "hi": "(4,0)",
    "hint_priority": 0,
}
