"""The SQL functions that build the wake-up channel's payloads, read back by pgqueue/wakeup.py:
the one builder and the one parser of that protocol agree."""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgqueue.queries import channel, query
from pgqueue.wakeup import CancelRequest, Wake, parse


def test_what_wake_and_wake_cancel_send_parses_back(dsn: str, schema: str) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as sender,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        sender.execute(
            sql.SQL("SELECT {s}.wake('mail', -5, 42), {s}.wake_cancel(17)").format(
                s=sql.Identifier(schema)
            )
        )
        got = [parse(n.payload) for n in listener.notifies(timeout=10, stop_after=2)]
    assert got == [Wake("mail", (-5, 42)), CancelRequest(17)]


def test_the_one_job_enqueue_calls_no_function_but_pg_notify(dsn: str, schema: str) -> None:
    """wake() is inlined where it is called, so it costs nothing beyond its pg_notify."""
    params = {
        "queue": "default",
        "task": "t",
        "args": "{}",
        "priority": 0,
        "max_attempts": 1,
        "run_at": None,
        "delay": None,
        "atomic": False,
        "concurrency_key": None,
        "tags": None,
        "now": None,
    }
    with psycopg.connect(dsn) as conn:
        explain = sql.SQL("EXPLAIN (VERBOSE, COSTS OFF) ") + query("job_insert_one", schema)
        plan = "\n".join(row[0] for row in conn.execute(explain, params))
        conn.rollback()
    assert "pg_notify" in plan
    assert ".wake(" not in plan
