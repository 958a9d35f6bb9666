"""A worker's writes look its jobs up by primary key, whatever the table's statistics say.

job_finish_many's rows are named by id, and each one must still be running. jobs_running_idx
(worker_id, WHERE status = 'running') matches that filter too, and with statistics that make
it look small (a table never analyzed, as on a server with autovacuum off, or analyzed while
empty) the planner preferred it. While a long transaction holds the horizon, that index keeps
an entry for every job that ever ran: the degradation bench on PostgreSQL 15 saw each batch of
100 outcomes walk 8,700 of its pages and take 138 ms on average (up to 992 ms), which
starved the claims of CPU.
A primary-key lookup costs the same whatever the index holds. The same holds for putting
jobs back (job_release_many) and for the cancellation fallback (job_list_cancel_requested).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import custom_plan, generic_plan, plan_nodes, succeeded
from pgqueue.queries import query
from tests.conftest import claim_params

# Run on each server CI tests against: the finish's plan is the server's planner's.
pytestmark = pytest.mark.each_server

RUNNING = 5000
QUEUED = 45000  # a table of some size: on a handful of pages a sequential scan is cheapest


def _fill(conn: psycopg.Connection[Any], schema: str, stats: str) -> None:
    table = sql.SQL("{}.jobs").format(sql.Identifier(schema))
    if stats == "analyzed-empty":
        conn.execute(sql.SQL("ANALYZE {}").format(table))
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (queue, task, args, status, worker_id, attempt, started_at) "
            "SELECT 'default', 't', '{{}}', 'running', g %% 4 + 1, 1, now() "
            "FROM generate_series(1, %s) AS g"
        ).format(table),
        [RUNNING],
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (queue, task, args) SELECT 'default', 't', '{{}}' "
            "FROM generate_series(1, %s)"
        ).format(table),
        [QUEUED],
    )
    if stats == "analyzed-full":
        conn.execute(sql.SQL("ANALYZE {}").format(table))


def _reads_of_jobs(plan: dict[str, Any]) -> list[str]:
    """How a plan reads jobs: the index of each index or bitmap scan, "Seq Scan"."""
    reads = []
    for node in plan_nodes(plan):
        index = node.get("Index Name", "")
        if index.startswith("jobs_"):
            reads.append(index)
        elif node.get("Relation Name") == "jobs" and node["Node Type"] == "Seq Scan":
            reads.append("Seq Scan")
    return reads


@pytest.mark.parametrize("stats", ["never-analyzed", "analyzed-empty", "analyzed-full"])
def test_a_workers_writes_find_their_jobs_by_primary_key(dsn: str, schema: str, stats: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The embedded server runs autovacuum: keep it off this table, so "never analyzed"
        # stays true for the length of the test.
        conn.execute(
            sql.SQL("ALTER TABLE {}.jobs SET (autovacuum_enabled = off)").format(
                sql.Identifier(schema)
            )
        )
        _fill(conn, schema, stats)
        ids = [
            r[0]
            for r in conn.execute(
                sql.SQL("SELECT id FROM {}.jobs WHERE worker_id = 1 ORDER BY id LIMIT 100").format(
                    sql.Identifier(schema)
                )
            )
        ]
    statements = {
        "job_finish_many": succeeded(ids),
        "job_release_many": {"ids": ids, "worker_id": 1},
        "job_list_cancel_requested": {"ids": ids, "worker_id": 1},
    }
    with psycopg.connect(dsn) as conn:
        for name, params in statements.items():
            for mode, explain in (("custom", custom_plan), ("generic", generic_plan)):
                reads = _reads_of_jobs(explain(conn, query(name, schema), params))
                assert reads, name
                assert set(reads) == {"jobs_pkey"}, (name, mode, reads)
        conn.rollback()


@pytest.mark.parametrize("prefer_indexes", [True, False], ids=["worker-session", "control"])
def test_plans_made_while_the_table_is_tiny_still_read_by_index(
    dsn: str, schema: str, prefer_indexes: bool
) -> None:
    """A worker prepares its statements at start, often on a nearly empty table, and keeps
    the generic plan until statistics change. In its sessions (session_prefer_indexes) those
    plans read jobs by index; the control shows what the planner picks without the setting."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {}.jobs SET (autovacuum_enabled = off)").format(
                sql.Identifier(schema)
            )
        )
        ids = [
            row[0]
            for row in conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args, status, worker_id, attempt) "
                    "SELECT 'default', 't', '{{}}', 'running', 1, 1 "
                    "FROM generate_series(1, 3) RETURNING id"
                ).format(sql.Identifier(schema))
            )
        ]
    statements = {
        "job_finish_many": succeeded(ids),
        "job_claim": claim_params(),
    }
    reads = {}
    with psycopg.connect(dsn) as conn:
        if prefer_indexes:
            conn.execute(query("session_prefer_indexes", schema))
        for name, params in statements.items():
            reads[name] = _reads_of_jobs(generic_plan(conn, query(name, schema), params))
        conn.rollback()
    if prefer_indexes:
        assert set(reads["job_finish_many"]) == {"jobs_pkey"}, reads
        assert all("Seq Scan" not in r for r in reads.values()), reads
    elif all("Seq Scan" not in r for r in reads.values()):
        # Which statements the planner scans on a tiny table depends on the server version.
        pytest.skip(f"this server reads a tiny jobs table by index anyway: {reads}")


@pytest.mark.parametrize("stats", ["never-analyzed", "analyzed-full"])
def test_the_rescuer_reads_only_the_silent_workers_entries(
    dsn: str, schema: str, stats: str
) -> None:
    """job_find_stranded looks jobs up per silent worker (jobs_running_idx by worker_id),
    never by walking every running entry."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("jobs", "workers"):
            conn.execute(
                sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(
                    sql.Identifier(schema, table)
                )
            )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (name, hostname, pid, queues, concurrency) "
                "SELECT 'w', 'h', g, ARRAY['default'], 10 FROM generate_series(1, 4) AS g"
            ).format(sql.Identifier(schema, "workers"))
        )
        _fill(conn, schema, stats)
        if stats == "analyzed-full":
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, "workers")))
    params = {"lease": 30.0, "now": None, "limit": 1000}
    with psycopg.connect(dsn) as conn:
        for mode, explain in (("custom", custom_plan), ("generic", generic_plan)):
            plan = explain(conn, query("job_find_stranded", schema), params)
            on_jobs = [n for n in plan_nodes(plan) if n.get("Index Name") == "jobs_running_idx"]
            assert on_jobs, json.dumps(plan, indent=1)
            assert all("worker_id = w.id" in n.get("Index Cond", "") for n in on_jobs), (
                mode,
                json.dumps(plan, indent=1),
            )
            seq = [n for n in plan_nodes(plan) if n.get("Relation Name") == "jobs"]
            assert all(n["Node Type"] != "Seq Scan" for n in seq), mode
        conn.rollback()


@pytest.mark.parametrize("ids", ["none", "some"])
def test_the_cancellation_fallback_reads_by_primary_key_after_stats_taken_while_jobs_ran(
    dsn: str, schema: str, ids: str
) -> None:
    """Statistics gathered while a few jobs ran make jobs_running_idx look tiny; the fallback
    still looks its ids up by primary key, so the dead running entries a long transaction
    keeps are never walked (with no id at all, a plan on that index walked every one)."""
    table = sql.Identifier(schema, "jobs")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off)").format(table))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args, status, worker_id, attempt, started_at) "
                "SELECT 'default', 't', '{{}}', 'running', 1, 1, now() "
                "FROM generate_series(1, 5)"
            ).format(table)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (queue, task, args) SELECT 'default', 't', '{{}}' "
                "FROM generate_series(1, %s)"
            ).format(table),
            [QUEUED],
        )
        conn.execute(sql.SQL("ANALYZE {}").format(table))
        with psycopg.connect(dsn) as holder:  # a long transaction keeps what follows dead
            holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT txid_current()")
            for _ in range(4):  # jobs worker 1 claimed and finished: dead running entries
                conn.execute(
                    sql.SQL(
                        "UPDATE {} SET status = 'running', worker_id = 1, attempt = 1 "
                        "WHERE id IN (SELECT id FROM {} WHERE status = 'queued' LIMIT 5000)"
                    ).format(table, table)
                )
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE status = 'running' AND id > 5").format(table)
                )
            running = [
                r[0]
                for r in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE status = 'running'").format(table)
                )
            ]
            params = {"ids": running if ids == "some" else [], "worker_id": 1}
            statement = query("job_list_cancel_requested", schema)
            with psycopg.connect(dsn) as conn2:
                conn2.execute(query("session_prefer_indexes", schema))  # as a worker's sessions
                for mode, explain in (("custom", custom_plan), ("generic", generic_plan)):
                    reads = _reads_of_jobs(explain(conn2, statement, params))
                    assert set(reads) == {"jobs_pkey"}, (mode, reads)
                doc = conn2.execute(
                    sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement, params
                ).fetchone()[0]  # type: ignore[index]
                plan = doc[0]["Plan"]
                buffers = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
                assert buffers < 40, buffers
                conn2.rollback()
            holder.rollback()
