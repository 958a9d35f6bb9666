"""The `pgqueue` command as a user meets it: a real process, a real PostgreSQL.

A wrong command line or configuration exits 2 with one line on stderr that names the problem;
an unreachable database exits 1 without a traceback; `worker --burst` and `demo` do their work
and exit 0.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import count, drop_schema, run_python

UNREACHABLE_DSN = "postgresql://nobody@127.0.0.1:1/x"


def run_pgqueue(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m pgqueue ARGS` from the checkout, with no DSN inherited from the environment."""
    result: subprocess.CompletedProcess[str] = run_python("-m", "pgqueue", *args, env=env)
    return result


def assert_usage_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 2, nothing on stdout, and a stderr that names the problem without a traceback."""
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.fixture
def fresh_schema_name(dsn: str) -> Iterator[str]:
    """A schema name nobody has created yet; dropped after the test whatever created it."""
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(dsn, name)


# -- the DSN -----------------------------------------------------------------------------------


def test_migrate_rejects_malformed_dsn_with_exit_2() -> None:
    result = run_pgqueue("migrate", "--dsn", "not a dsn==")
    assert_usage_error(result, "pgqueue: error: invalid DSN")


def test_worker_rejects_malformed_listen_dsn_with_exit_2(dsn: str) -> None:
    result = run_pgqueue(
        "worker",
        "tests.apps.tasks:queue",
        "--dsn",
        dsn,
        "--poll-only",
        "--listen-dsn",
        "not a dsn==",
    )
    assert_usage_error(result, "pgqueue: error: invalid --listen-dsn")


def test_migrate_on_unreachable_server_exits_1_saying_cannot_connect_without_traceback() -> None:
    result = run_pgqueue("migrate", "--dsn", UNREACHABLE_DSN)
    assert result.returncode == 1, result.stderr
    assert "cannot connect" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


# -- the MODULE:ATTR argument of `worker` ---------------------------------------------------


def test_worker_rejects_app_whose_module_does_not_import_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "no_such_module:queue", "--dsn", dsn)
    assert_usage_error(result, "cannot import 'no_such_module'", "ModuleNotFoundError")


def test_worker_rejects_app_without_colon_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks", "--dsn", dsn)
    assert_usage_error(result, "'tests.apps.tasks' is not MODULE:ATTR")


def test_worker_rejects_app_with_missing_attribute_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:nope", "--dsn", dsn)
    assert_usage_error(result, "module 'tests.apps.tasks' has no attribute 'nope'")


def test_worker_rejects_app_that_is_a_task_not_a_queue_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:record", "--dsn", dsn)
    assert_usage_error(result, "tests.apps.tasks:record is a Task, not a pgqueue Queue")


# -- option values, checked by argparse before anything connects ------------------------------


def test_worker_rejects_concurrency_zero_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--concurrency", "0", "--dsn", dsn)
    assert_usage_error(result, "usage:", "argument --concurrency", "0 is not 1 or more")


def test_worker_rejects_concurrency_that_is_not_a_number_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--concurrency", "abc", "--dsn", dsn)
    assert_usage_error(result, "usage:", "argument --concurrency", "'abc' is not a whole number")


def test_worker_rejects_negative_poll_interval_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--poll-interval", "-1", "--dsn", dsn)
    assert_usage_error(result, "usage:", "argument --poll-interval", "-1")


def test_worker_rejects_queue_name_with_space_and_bang_with_exit_2(dsn: str) -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--queues", "bad name!", "--dsn", dsn)
    assert_usage_error(result, "usage:", "argument --queues", "invalid queue name 'bad name!'")


def test_migrate_rejects_schema_name_with_sql_in_it_and_creates_nothing(dsn: str) -> None:
    bad = "x; drop table y"
    result = run_pgqueue("migrate", "--schema", bad, "--dsn", dsn)
    assert_usage_error(result, "usage:", "argument --schema", f"invalid schema name {bad!r}")
    with psycopg.connect(dsn) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname IN (%s, 'x')", [bad]
        ).fetchone()
    assert found == (0,)


# -- commands that do their work ---------------------------------------------------------------


def test_worker_burst_runs_every_queued_job_once_then_exits_0(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    try:
        ids = queue.enqueue_many([apps.record.job(i) for i in range(20)])
    finally:
        queue.close()

    result = run_pgqueue(
        "worker",
        "tests.apps.tasks:queue",
        "--burst",
        "--schema",
        schema,
        "--dsn",
        dsn,
        env={"PGQUEUE_TEST_RUNS": str(tmp_path)},
    )

    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and " ERROR " not in result.stderr, result.stderr
    assert sorted(apps.read_runs(tmp_path)) == sorted(zip(ids, map(str, range(20)), strict=True))
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 0
        history = conn.execute(
            sql.SQL("SELECT id, status FROM {}.job_history ORDER BY id").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    assert history == [(job_id, "succeeded") for job_id in sorted(ids)]


def test_demo_runs_committed_jobs_only_and_reports_throughput(
    dsn: str, fresh_schema_name: str
) -> None:
    result = run_pgqueue("demo", "--jobs", "50", "--dsn", dsn, "--schema", fresh_schema_name)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("jobs that ran:") and "50 of 50" in line for line in lines)
    must_be_zero = [line for line in lines if line.endswith("(must be 0)")]
    assert len(must_be_zero) == 2, result.stdout
    assert all(line.endswith(" 0 (must be 0)") for line in must_be_zero), result.stdout
    assert any(line.startswith("throughput:") and "jobs/s" in line for line in lines)
    assert "OK" in lines


def test_demo_on_the_users_database_says_so_and_writes_only_its_own_schema(
    own_database: str,
) -> None:
    result = run_pgqueue("demo", "--jobs", "5", env={"PGQUEUE_DSN": own_database})

    assert result.returncode == 0, result.stderr
    dbname = psycopg.conninfo.conninfo_to_dict(own_database)["dbname"]
    first = result.stdout.splitlines()[1]  # after the title, before anything is written
    assert f"database {dbname} on " in first and "(from PGQUEUE_DSN)" in first, result.stdout
    assert "schema pgqueue_demo: the demo's own" in first, result.stdout
    assert 'DROP SCHEMA "pgqueue_demo" CASCADE;' in result.stdout
    with psycopg.connect(own_database) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace"
            " WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1"
        ).fetchall()
        in_public = conn.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace)"
            " + (SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace)"
        ).fetchone()
    assert schemas == [("pgqueue_demo",), ("public",)]
    assert in_public == (0,)


def test_schema_error_states_the_schema_rule() -> None:
    result = run_pgqueue("migrate", "--schema", "has-dash", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(result, "letters, digits and _, starting with a letter or _")


def test_demo_refuses_to_drop_a_schema_that_is_not_its_own(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    queue.enqueue(queue.declare("some.task").job(x=1))
    queue.close()
    result = run_pgqueue("demo", "--jobs", "5", "--dsn", dsn, "--schema", schema)
    assert result.returncode == 2, result.stderr
    assert "is not a pgqueue demo schema" in result.stderr
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "jobs") == 1


def test_database_errors_exit_1_with_a_message_not_a_traceback(
    dsn: str, fresh_schema_name: str
) -> None:
    role = f"pgq_noperm_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A plain login role has no CREATE on the database, so CREATE SCHEMA fails.
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
        info["user"] = role
        weak_dsn = psycopg.conninfo.make_conninfo("", **info)
        result = run_pgqueue("migrate", "--dsn", weak_dsn, "--schema", fresh_schema_name)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        assert "InsufficientPrivilege" in result.stderr or "permission denied" in result.stderr
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_worker_refuses_a_lease_shorter_than_two_heartbeats(dsn: str) -> None:
    result = run_pgqueue(
        "worker",
        "tests.apps.tasks:queue",
        "--dsn",
        dsn,
        "--lease-timeout",
        "1",
        "--heartbeat-interval",
        "5",
    )
    assert_usage_error(result, "lease_timeout must be at least 2 x heartbeat_interval")


def test_grant_quotes_a_hostile_role_name_and_grants_exactly_the_worker_set(
    dsn: str, schema: str
) -> None:
    hostile = 'evil"; DROP TABLE x; --'
    printed = run_pgqueue("grant", hostile, "--kind", "worker", "--sql", "--schema", schema)
    assert printed.returncode == 0, printed.stderr
    assert 'TO "evil""; DROP TABLE x; --";' in printed.stdout
    role = f"pgq_r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        result = run_pgqueue("grant", role, "--kind", "app", "--schema", schema, "--dsn", dsn)
        assert result.returncode == 0, result.stderr
        with psycopg.connect(dsn) as conn:
            (can_insert, can_delete) = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'INSERT'), "
                "has_table_privilege(%s, %s, 'DELETE')",
                [role, f"{schema}.jobs", role, f"{schema}.jobs"],
            ).fetchone()  # type: ignore[misc]
        assert (can_insert, can_delete) == (True, False)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
