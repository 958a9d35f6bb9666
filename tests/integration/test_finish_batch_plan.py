"""Writing a batch of outcomes costs O(batch), whatever the statistics say (STYLE: SQL).

job_finish_many looks each job's outcome up by key, never through a join with the outcomes:
a join was planned as a nested loop over every outcome for every row, quadratic in the batch,
or with stale statistics as a walk of every running row once per outcome (as the throughput
bench once found). test_finish_plan.py checks which index each of a worker's writes reads.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import generic_plan, plan_nodes
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params
from tests.conftest import function_calls, wait_until

# Run on each server CI tests against: the finish's plan is the server's planner's.
pytestmark = pytest.mark.each_server

JOINS = {"Nested Loop", "Hash Join", "Merge Join"}


@pytest.fixture
def running(dsn: str, schema: str) -> list[int]:
    """300 jobs running for worker 1 among 5,000, in a table analysed while empty."""
    table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ANALYZE {}").format(table))
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency) "
                "VALUES ('w', 'h', 1, '{{default}}', 300)"
            ).format(sql.Identifier(schema))
        )
        worker_id = conn.execute(
            sql.SQL("SELECT max(id) FROM {}.workers").format(sql.Identifier(schema))
        ).fetchone()
        assert worker_id is not None
        rows = conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, status, attempt, worker_id, started_at) "
                "SELECT 'default', 't', '{{}}', "
                "CASE WHEN g <= 300 THEN 'running' ELSE 'queued' END, "
                "CASE WHEN g <= 300 THEN 1 ELSE 0 END, "
                "CASE WHEN g <= 300 THEN %s::bigint END, "
                "CASE WHEN g <= 300 THEN now() END "
                "FROM generate_series(1, 5000) AS g RETURNING id, status"
            ).format(table),
            [worker_id[0]],
        ).fetchall()
    return [row[0] for row in rows if row[1] == "running"], worker_id[0]  # type: ignore[return-value]


@pytest.mark.parametrize("status", ["succeeded", "retry"])
def test_finishing_a_batch_joins_nothing_and_never_scans_jobs(
    dsn: str, schema: str, running: Any, status: str
) -> None:
    ids, worker_id = running
    outcomes = [
        {
            "id": job_id,
            "attempt": 1,
            "worker_id": worker_id,
            "status": status,
            "error": None if status == "succeeded" else {"error": "boom"},
            "result": None,
            "duration": 0.001,
            "retry_in": 0.0,
        }
        for job_id in ids
    ]
    params = finish_rows_params(outcomes)
    statement = query("job_finish_many", schema)
    with psycopg.connect(dsn) as conn:
        # The generic plan a prepared write may settle on: no join, no scan of jobs either.
        nodes = plan_nodes(generic_plan(conn, statement, params))
        assert not [n for n in nodes if n["Node Type"] in JOINS], nodes
        assert not [
            n for n in nodes if n.get("Relation Name") == "jobs" and n["Node Type"] == "Seq Scan"
        ], nodes
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement
        (doc,) = conn.execute(explain, params).fetchone()  # type: ignore[misc]
        plan = (doc if isinstance(doc, list) else json.loads(doc))[0]["Plan"]
        nodes = plan_nodes(plan)
        assert not [n for n in nodes if n["Node Type"] in JOINS], json.dumps(plan, indent=1)
        on_jobs = [
            n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
        ]
        assert on_jobs and all(n["Node Type"] != "Seq Scan" for n in on_jobs), json.dumps(
            plan, indent=1
        )
        moved = [
            n for n in nodes if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "jobs"
        ]
        # Retries move in retry_outcomes, whose reads the next test counts.
        expected = len(ids) if status == "succeeded" else 0
        assert sum(n["Actual Rows"] for n in moved) == expected, json.dumps(plan, indent=1)
        conn.rollback()


def _counts(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    """Calls of retry_outcomes and scans of each index of jobs, as far as sessions have
    handed theirs over."""
    calls = function_calls(conn, schema, "retry_outcomes")
    scans = conn.execute(
        "SELECT indexrelname, idx_scan FROM pg_stat_user_indexes"
        " WHERE schemaname = %s AND relname = 'jobs'",
        [schema],
    ).fetchall()
    return {"retry_outcomes": calls} | {n: int(c) for n, c in scans}


@pytest.mark.parametrize("status", ["succeeded", "retry"])
def test_retries_move_in_a_function_called_only_for_them_and_read_by_primary_key(
    dsn: str, schema: str, running: Any, status: str
) -> None:
    """A batch without retries never calls retry_outcomes (an UPDATE in the statement itself
    opened every index of jobs for every batch); a batch of retries calls it once, and it
    finds its rows by primary key in this table analysed while empty, never through
    jobs_running_idx, which a long transaction fills with every job that ever ran. Counted by
    PostgreSQL: the session counts its function calls and index scans, and hands them over as
    it ends."""
    ids, worker_id = running
    outcomes = [
        {"id": job_id, "attempt": 1, "worker_id": worker_id, "status": status, "retry_in": 0.0}
        for job_id in ids
    ]
    with psycopg.connect(dsn, autocommit=True) as reader:
        before = _counts(reader, schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET track_functions = 'pl'")
            for _ in range(7):  # past the custom plans: the plan the session keeps, too
                row = conn.execute(
                    query("job_finish_many", schema), finish_rows_params(outcomes)
                ).fetchone()
                assert row is not None
                if status == "retry":
                    # Each round puts the jobs back; run them again for the next.
                    assert row[1] == len(ids), row
                    conn.execute(
                        sql.SQL(
                            "UPDATE {}.jobs SET status = 'running', worker_id = %s"
                            " WHERE id = ANY(%s)"
                        ).format(sql.Identifier(schema)),
                        [worker_id, ids],
                    )
                else:
                    assert row[0] == len(ids), row
                    break
        wait_until(
            lambda: _counts(reader, schema)["jobs_pkey"] > before["jobs_pkey"],
            timeout=10,
            what="the session's counts",
        )
        after = _counts(reader, schema)
    assert after["retry_outcomes"] - before["retry_outcomes"] == (7 if status == "retry" else 0)
    assert after["jobs_running_idx"] == before["jobs_running_idx"], (before, after)


def test_a_mixed_batch_moves_each_job_by_its_own_outcome(
    dsn: str, schema: str, running: Any
) -> None:
    """Retried ids travel apart from the others (`retries`): each outcome still moves exactly
    its own job, whatever mix the batch holds."""
    ids, worker_id = running
    kinds = ["succeeded", "retry", "failed", "retry", "cancelled"]
    status = {job_id: kinds[n % len(kinds)] for n, job_id in enumerate(ids)}
    outcomes = [
        {
            "id": job_id,
            "attempt": 1,
            "worker_id": worker_id,
            "status": status[job_id],
            "error": None if status[job_id] == "succeeded" else {"error": "boom"},
            "result": None,
            "duration": 0.001,
            "retry_in": 60.0 if n % 2 else 0.0,
        }
        for n, job_id in enumerate(ids)
    ]
    params = finish_rows_params(outcomes)
    retried = {job_id for job_id, kind in status.items() if kind == "retry"}
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query("job_finish_many", schema), params).fetchone()
        assert row is not None
        assert (row[0], row[1], row[2]) == (
            len(ids) - len(retried),
            len(retried),
            len(ids) - len(retried),
        )
        left = _statuses(conn, schema, "jobs", ids)
        assert set(left) == retried
        assert set(left.values()) == {"queued", "scheduled"}
        archived = _statuses(conn, schema, "job_history", ids)
        assert archived == {job_id: kind for job_id, kind in status.items() if kind != "retry"}


def _statuses(
    conn: psycopg.Connection[Any], schema: str, table: str, ids: list[int]
) -> dict[int, str]:
    statement = sql.SQL("SELECT id, status FROM {}.{} WHERE id = ANY(%s)").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    return dict(conn.execute(statement, [ids]).fetchall())
