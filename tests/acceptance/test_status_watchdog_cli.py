"""`pgqueue status` and `pgqueue watchdog` as an operator runs them: a real process, a real
PostgreSQL, and a deliberately idle transaction holding back the xmin horizon.

The test server may be shared. Reports may list other people's sessions, so assertions are about
this test's pids. `watchdog --terminate` acts on every session of its database that is over the
limit, so it only ever runs against a database created for the one test and dropped after it.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.health import Status, WatchdogReport
from pgqueue.migrate import apply
from pgqueue.queries import query
from tests.acceptance.test_cli import UNREACHABLE_DSN, assert_usage_error, run_pgqueue
from tests.conftest import claim_params, session, wait_until

# Run on each server CI tests against: the watchdog reads the server's statistics views.
pytestmark = pytest.mark.each_server


def idle_app() -> str:
    return f"pgq-test-idle-{uuid.uuid4().hex}"


def wait_idle_in_transaction(dsn: str, pid: int) -> None:
    def idle() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state FROM pg_stat_activity WHERE pid = %s", [pid]
            ).fetchone()
        return row == ("idle in transaction",)

    wait_until(idle, timeout=10, what=f"pid {pid} idle in transaction")


def live_pids(dsn: str, pids: list[int]) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        return {row[0] for row in rows.fetchall()}


# -- status ------------------------------------------------------------------------------------


def test_status_json_names_an_idle_transaction_by_pid_and_application(
    dsn: str, schema: str
) -> None:
    app = idle_app()
    with session(dsn, app, hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        wait_idle_in_transaction(dsn, pid)
        result = run_pgqueue("status", "--json", "--schema", schema, "--dsn", dsn)

    assert result.returncode == 0, result.stderr
    report = Status.model_validate_json(result.stdout)
    mine = [h for h in report.holders if h.pid == pid]
    assert len(mine) == 1, result.stdout
    assert (mine[0].kind, mine[0].application_name) == ("session", app)
    assert mine[0].state == "idle in transaction"
    assert report.schema_name == schema


def test_status_table_exits_0_and_shows_each_queue_and_holders_verbatim(
    own_database: str,
) -> None:
    schema, name = "pgq_test_status", f"status-{uuid.uuid4().hex[:8]}"
    keyed = f"{name}-keyed"
    with psycopg.connect(own_database, autocommit=True) as conn:
        apply(conn, schema)
    queue = Queue(own_database, schema=schema)
    try:
        t = queue.task(name="t", queue=name)(lambda i: None)
        queue.enqueue_many([t.job(i) for i in range(3)])
        k = queue.task(name="k", queue=keyed, concurrency_key="tenant:1")(lambda i: None)
        queue.set_concurrency_limit("tenant:1", 0)  # paused: the claim below parks both jobs
        queue.enqueue_many([k.job(i) for i in range(2)])
    finally:
        queue.close()
    with psycopg.connect(own_database, autocommit=True) as conn:
        conn.execute(query("job_claim", schema), claim_params(keyed))

    with session(own_database, "pgq-test-[/]", hold_horizon=False) as odd:
        # Brackets are rich markup: they must be printed, not interpreted (or choked on).
        odd.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        odd.execute("SELECT '[/] [bold]'")
        wait_idle_in_transaction(own_database, odd.info.backend_pid)
        result = run_pgqueue(
            "status", "--schema", schema, "--dsn", own_database, env={"COLUMNS": "200"}
        )
        # A common terminal's width, and a pipe (no terminal, no COLUMNS): the table fits.
        narrow = run_pgqueue(
            "status", "--schema", schema, "--dsn", own_database, env={"COLUMNS": "80"}
        )
        # An empty COLUMNS is as good as none to rich, whatever the test runner's terminal.
        piped = run_pgqueue(
            "status", "--schema", schema, "--dsn", own_database, env={"COLUMNS": ""}
        )

    assert result.returncode == 0, result.stderr
    assert narrow.returncode == 0, narrow.stderr
    assert piped.returncode == 0, piped.stderr
    for shown in (narrow.stdout, piped.stdout):
        assert max(len(line) for line in shown.splitlines()) <= 80, shown
        header = next(line for line in shown.splitlines() if line.startswith("queue "))
        assert header.split() == COLUMNS, shown
        cells = _rows(shown)
        assert cells[name][:5] == ["3", "0", "0", "0", "0"], shown
        assert cells[keyed][:5] == ["0", "0", "0", "2", "0"], shown
    wide = _rows(result.stdout)
    assert wide[name][:5] == ["3", "0", "0", "0", "0"], result.stdout
    assert f"{schema}.jobs" in result.stdout
    assert "pgq-test-[/]" in result.stdout
    assert "SELECT '[/] [bold]'" in result.stdout


COLUMNS = [
    "queue",
    "queued",
    "sched",
    "running",
    "waiting",
    "blocked",
    "fail/h",
    "done/m",
    "oldest",
]


def _rows(table: str) -> dict[str, list[str]]:
    """The queue table's body rows: each queue's cells after its name, by name."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("queue ")) + 2
    rows = {}
    for line in lines[start:]:
        cells = line.replace(" (paused)", "(paused)").split()
        if len(cells) != len(COLUMNS):
            break
        rows[cells[0]] = cells[1:]
    return rows


def test_status_cuts_a_long_queue_name_and_keeps_every_count_in_80_columns(
    dsn: str, schema: str
) -> None:
    long_name = "a_queue_whose_name_goes_on_well_past_what_a_terminal_line_has_room_for"
    queue = Queue(dsn, schema=schema)
    try:
        task = queue.declare("t", queue=long_name)
        queue.enqueue_many([task.job() for _ in range(1234)])
        queue.enqueue(queue.declare("m", queue="mail").job())
        queue.pause_queue("mail")
    finally:
        queue.close()
    result = run_pgqueue("status", "--schema", schema, "--dsn", dsn, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, result.stdout
    (row,) = [line for line in lines if line.startswith("a_queue_whose")]
    assert row.split()[0].endswith("…") and row.split()[1] == "1,234", result.stdout
    (paused,) = [line for line in lines if line.startswith("mail")]
    assert paused.split()[:3] == ["mail", "(paused)", "1"], result.stdout


def test_status_of_an_unmigrated_schema_exits_1_saying_to_migrate(dsn: str) -> None:
    result = run_pgqueue("status", "--schema", "pgq_test_never_migrated", "--dsn", dsn)
    assert result.returncode == 1, result.stderr
    assert "has no pgqueue tables: run `pgqueue migrate" in result.stderr
    assert "Traceback" not in result.stderr


# -- watchdog ----------------------------------------------------------------------------------


def test_watchdog_dry_run_exits_3_and_names_the_idle_pid_without_terminating_it(
    dsn: str,
) -> None:
    with session(dsn, idle_app(), hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        wait_idle_in_transaction(dsn, pid)

        result = run_pgqueue("watchdog", "--max-age", "0s", "--dsn", dsn)

        assert result.returncode == 3, result.stderr
        assert str(pid) in result.stdout
        assert "dry run: would terminate" in result.stdout
        assert idle.execute("SELECT 1").fetchone() == (1,)


def test_watchdog_json_dry_run_lists_the_holder_as_remaining(dsn: str) -> None:
    app = idle_app()
    with session(dsn, app, hold_horizon=True) as idle:
        pid = idle.info.backend_pid
        wait_idle_in_transaction(dsn, pid)

        result = run_pgqueue("watchdog", "--max-age", "0s", "--json", "--dsn", dsn)

        assert idle.execute("SELECT 1").fetchone() == (1,)
    assert result.returncode == 3, result.stderr
    report = WatchdogReport.model_validate_json(result.stdout)
    assert not report.acted and report.terminated == []
    assert [h.application_name for h in report.remaining if h.pid == pid] == [app]


def test_watchdog_terminate_ends_the_holder_spares_idle_and_pgqueue_sessions_and_exits_0(
    dsn: str, own_database: str
) -> None:
    with (
        session(own_database, idle_app(), hold_horizon=True) as victim,
        session(own_database, idle_app(), hold_horizon=False) as bystander,
        session(own_database, "pgqueue:claim", hold_horizon=False) as worker,
        session(dsn, idle_app(), hold_horizon=True) as other_database,
    ):
        pids = [c.info.backend_pid for c in (victim, bystander, worker, other_database)]
        wait_idle_in_transaction(own_database, pids[0])
        wait_idle_in_transaction(dsn, pids[3])

        result = run_pgqueue("watchdog", "--max-age", "0s", "--terminate", "--dsn", own_database)

        assert result.returncode == 0, result.stdout + result.stderr
        assert f"terminated pid {pids[0]}" in result.stdout
        assert str(pids[3]) not in result.stdout
        assert live_pids(dsn, pids) == {pids[1], pids[2], pids[3]}
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
        for spared in (bystander, worker, other_database):
            assert spared.execute("SELECT 1").fetchone() == (1,)


def test_watchdog_terminate_never_ends_a_pgqueue_connection_and_exits_3_while_it_holds(
    own_database: str,
) -> None:
    with session(own_database, "pgqueue:claim", hold_horizon=True) as worker:
        pid = worker.info.backend_pid
        wait_idle_in_transaction(own_database, pid)

        result = run_pgqueue("watchdog", "--max-age", "0s", "--terminate", "--dsn", own_database)

        assert result.returncode == 3, result.stdout + result.stderr
        assert f"still holding back the horizon: pid {pid} (pgqueue:claim)" in result.stdout
        assert worker.execute("SELECT 1").fetchone() == (1,)


def test_watchdog_terminate_leaves_holders_younger_than_max_age_alone_and_exits_0(
    own_database: str,
) -> None:
    with session(own_database, idle_app(), hold_horizon=True) as idle:
        wait_idle_in_transaction(own_database, idle.info.backend_pid)

        result = run_pgqueue("watchdog", "--max-age", "1h", "--terminate", "--dsn", own_database)

        assert result.returncode == 0, result.stdout + result.stderr
        assert "nothing has held back the xmin horizon for 1h00m or more" in result.stdout
        assert idle.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("10m", 600), ("1h", 3600), ("1h30m", 5400), ("2.5", 2.5), ("1h0m5s", 3605)],
)
def test_watchdog_reads_max_age_in_hours_minutes_seconds_or_plain_seconds(
    own_database: str, text: str, seconds: float
) -> None:
    result = run_pgqueue("watchdog", "--max-age", text, "--json", "--dsn", own_database)
    assert result.returncode == 0, result.stderr
    report = WatchdogReport.model_validate_json(result.stdout)
    assert report.max_age == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["banana", "10x", "-5s", "1m1h", "h", "1.5h", ""])
def test_watchdog_rejects_a_malformed_max_age_with_exit_2_naming_the_option(text: str) -> None:
    # --max-age=VALUE, or argparse would read "-5s" as an option of its own.
    result = run_pgqueue("watchdog", f"--max-age={text}", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(result, "usage:", "argument --max-age", f"{text!r} is not a duration")


def test_watchdog_without_max_age_exits_2() -> None:
    result = run_pgqueue("watchdog", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(result, "the following arguments are required: --max-age")


def test_watchdog_terminate_without_permission_exits_3_and_leaves_the_session(
    own_database: str,
) -> None:
    role = f"pgq_test_watch_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(own_database, autocommit=True) as conn:
        # Sees every session (pg_read_all_stats) but may not signal a superuser's.
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE pg_read_all_stats").format(sql.Identifier(role))
        )
    try:
        info = psycopg.conninfo.conninfo_to_dict(own_database)
        info["user"] = role
        weak_dsn = psycopg.conninfo.make_conninfo("", **info)
        with session(own_database, idle_app(), hold_horizon=True) as idle:
            pid = idle.info.backend_pid
            wait_idle_in_transaction(own_database, pid)

            result = run_pgqueue("watchdog", "--max-age", "0s", "--terminate", "--dsn", weak_dsn)

            assert result.returncode == 3, result.stdout + result.stderr
            assert f"not permitted to terminate pid {pid}" in result.stderr
            assert "Traceback" not in result.stderr
            assert f"still holding back the horizon: pid {pid}" in result.stdout
            assert idle.execute("SELECT 1").fetchone() == (1,)
    finally:
        with psycopg.connect(own_database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
