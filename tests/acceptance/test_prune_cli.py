"""`pgqueue prune` as a user runs it: a real process against a real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.conftest import count
from tests.integration.test_retention import add_history


def test_prune_deletes_old_history_of_one_status_and_queue_and_says_how_much(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    conn.commit()
    add_history(conn, schema, 30, age=timedelta(days=8), queue="mail", now=now)
    add_history(conn, schema, 7, age=timedelta(days=8), queue="mail", status="failed", now=now)
    add_history(conn, schema, 5, age=timedelta(days=1), queue="mail", now=now)
    result = run_pgqueue(
        "prune", "--dsn", dsn, "--schema", schema, "--older-than", "7d",
        "--status", "succeeded", "--queue", "mail", "--batch-size", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "deleted 30 finished jobs older than 7 days," in result.stderr
    assert "in 4 batches" in result.stderr
    assert count(conn, schema, "job_history") == 12
    everything = run_pgqueue("prune", "--dsn", dsn, "--schema", schema, "--older-than", "1d1h")
    assert everything.returncode == 0, everything.stderr
    assert "deleted 7 finished jobs and 0 periodic ticks older than 1 day 1 hour," in (
        everything.stderr
    )
    assert count(conn, schema, "job_history") == 5


def test_prune_says_one_job_and_its_age_in_words(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    conn.commit()
    add_history(conn, schema, 1, age=timedelta(days=2), queue="mail", now=now)
    result = run_pgqueue(
        "prune", "--dsn", dsn, "--schema", schema, "--older-than", "1d", "--queue", "mail"
    )
    assert result.returncode == 0, result.stderr
    assert "deleted 1 finished job older than 1 day, in " in result.stderr, result.stderr
    assert "0:00:00" not in result.stderr and "1 jobs" not in result.stderr, result.stderr
    assert count(conn, schema, "job_history") == 0


def test_prune_drops_a_whole_day_of_history_and_says_so(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    from psycopg import sql

    s = sql.Identifier(schema)
    # A partition of days gone by, as the workers' upkeep made them then.
    conn.execute(
        sql.SQL(
            "CREATE TABLE {s}.job_history_old (LIKE {s}.job_history INCLUDING DEFAULTS"
            " INCLUDING CONSTRAINTS); ALTER TABLE {s}.job_history_old ADD PRIMARY KEY (id);"
            " ALTER TABLE {s}.job_history ATTACH PARTITION {s}.job_history_old FOR VALUES"
            " FROM (now() - interval '4 days') TO (now() - interval '2 days')"
        ).format(s=s)
    )
    conn.commit()
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    add_history(conn, schema, 9, age=timedelta(days=3), queue="mail", now=now)
    result = run_pgqueue("prune", "--dsn", dsn, "--schema", schema, "--older-than", "1d")
    assert result.returncode == 0, result.stderr
    assert "dropped 1 day of history (job_history_old, about" in result.stderr
    assert "deleted 0 finished jobs" in result.stderr
    assert count(conn, schema, "job_history") == 0


def test_prune_refuses_a_bad_age_or_status_with_a_usage_error(dsn: str) -> None:
    bad_age = run_pgqueue("prune", "--dsn", dsn, "--older-than", "a week")
    assert_usage_error(bad_age, "argument --older-than", "'a week' is not a duration")
    bad_status = run_pgqueue("prune", "--dsn", dsn, "--older-than", "7d", "--status", "queued")
    assert_usage_error(bad_status, "argument --status", "'queued' is not a finished status")


def test_worker_history_retention_out_of_range_is_a_usage_error_naming_the_setting(
    dsn: str,
) -> None:
    result = run_pgqueue(
        "worker", "tests.apps.tasks:queue", "--dsn", dsn, "--burst", "--history-retention", "5s"
    )
    assert_usage_error(result, "history_retention=", "must be from 0:01:00")
