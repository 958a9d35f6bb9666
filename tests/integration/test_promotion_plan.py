"""The promotion of due jobs (job_promote_due), run by every worker at every poll, reads a
few index entries however many jobs are scheduled for later: it used to take the next due
time as a min() over all of them, which read every parked durable job each time."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import generic_plan, plan_nodes
from pgqueue.queries import query

# Run on each server CI tests against: the plan is the server's planner's.
pytestmark = pytest.mark.each_server


def _jobs_buffers(plan: dict[str, Any]) -> int:
    return sum(
        n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
        for n in plan_nodes(plan)
        if n.get("Relation Name") == "jobs"
    )


def test_promotion_reads_the_next_due_job_not_every_job_scheduled_later(
    dsn: str, schema: str
) -> None:
    name = sql.Identifier(schema)
    params = {"queues": ["default", "other"], "limit": 1000, "now": None}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, status, run_at)"
                " SELECT 'default', 't', '{{}}', 'scheduled', now() + interval '1 day'"
                " + g * interval '1 second' FROM generate_series(1, 20000) AS g"
            ).format(name)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, status, run_at)"
                " VALUES ('other', 't', '{{}}', 'scheduled', now() + interval '1 hour')"
            ).format(name)
        )
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(name))
    with psycopg.connect(dsn) as conn:
        conn.execute(query("session_prefer_indexes", schema))  # as the claim connection
        plan = generic_plan(conn, query("job_promote_due", schema), params, analyze=True)
        conn.rollback()
        row = conn.execute(query("job_promote_due", schema), params).fetchone()
        conn.rollback()
    assert row is not None
    promoted, next_due_in, _ = row
    assert promoted == 0
    assert 3500 < next_due_in <= 3600  # the other queue's job, in an hour
    assert _jobs_buffers(plan) < 30, plan  # a few index pages, not the 20,000 jobs' pages
