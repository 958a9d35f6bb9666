"""`pgqueue recurring`: the recurring jobs, as a real worker schedules them and a real process
lists them: name, task, schedule in words, next and last run, and whether it runs at all."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import Queue
from tests.acceptance.test_cli import run_pgqueue
from tests.acceptance.test_cli_app import pgqueue_in
from tests.conftest import ROOT, stop_worker_processes, wait_until, worker_process

CLOCK = """
from datetime import timedelta

from pgqueue import Queue

queue = Queue({dsn!r}, schema={schema!r})


@queue.periodic(cron="0 6 * * 1")
@queue.task(name="clock.weekly", queue="mail")
def weekly() -> None: ...
"""

TICK = """

@queue.periodic(every=timedelta(seconds=1))
@queue.task(name="clock.tick", queue="ticks")
def tick() -> None: ...
"""


def write_clock(folder: Path, dsn: str, schema: str, *, with_tick: bool = True) -> Path:
    text = CLOCK.format(dsn=dsn, schema=schema) + (TICK if with_tick else "")
    (folder / "clock.py").write_text(textwrap.dedent(text))
    return folder


def listed(folder: Path, *args: str) -> dict[str, dict[str, Any]]:
    result = pgqueue_in(folder, "recurring", "--json", *args)
    assert result.returncode == 0, result.stderr
    return {row["name"]: row for row in json.loads(result.stdout)}


def test_recurring_lists_each_job_from_new_to_active_paused_and_idle(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    (tmp_path / "app").mkdir()
    app = write_clock(tmp_path / "app", dsn, schema)
    db = ("--dsn", dsn, "--schema", schema)

    before = listed(app, "--app", "clock:queue")
    assert {name: row["state"] for name, row in before.items()} == {
        "clock.tick": "new",
        "clock.weekly": "new",
    }
    assert before["clock.tick"]["schedule"] == "every second"
    assert before["clock.weekly"]["schedule"] == "Mondays at 06:00 UTC"
    assert before["clock.weekly"]["next_run"] and before["clock.weekly"]["last_run"] is None
    assert listed(app, *db) == {}  # no worker has stored any yet

    proc = worker_process(
        dsn,
        schema,
        "--queues",
        "all",
        log=tmp_path / "worker.log",
        app="clock:queue",
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(app)])},
    )
    try:
        wait_until(
            lambda: listed(app, *db).get("clock.tick", {}).get("last_run") is not None,
            what="the worker's scheduler to make a tick a job",
        )
        running = listed(app, *db)
        assert {name: row["state"] for name, row in running.items()} == {
            "clock.tick": "active",
            "clock.weekly": "active",
        }
        assert running["clock.tick"]["last_job_id"] is not None
        assert running["clock.weekly"]["last_run"] is None
        assert running["clock.tick"]["queue"] is None  # only the app knows the queue

        queue = Queue(dsn, schema=schema)
        queue.pause_queue("mail")
        queue.close()
        paused = listed(app, "--app", "clock:queue")
        assert paused["clock.weekly"]["state"] == "paused"
        assert paused["clock.weekly"]["queue"] == "mail"
        assert paused["clock.tick"]["state"] == "active"

        table = pgqueue_in(app, "recurring", *db, env={"COLUMNS": "80"})
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == [
            "name",
            "task",
            "schedule",
            "next",
            "run",
            "last",
            "run",
            "state",
        ]
        assert max(len(line) for line in lines) <= 80, table.stdout
        weekly = next(line for line in lines if line.startswith("clock.weekly"))
        assert "Mondays at 06:00 UTC" in weekly and weekly.split()[-2:] == ["never", "active"]
    finally:
        stop_worker_processes([proc])

    # No worker has scheduled them for longer than a scheduler ever sleeps: they are idle.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.periodic SET updated_at = now() - interval '10 minutes'").format(
                sql.Identifier(schema)
            )
        )
    assert {row["state"] for row in listed(app, *db).values()} == {"idle"}

    # An app that no longer defines one: its workers will not run it.
    smaller = write_clock(tmp_path, dsn, schema, with_tick=False)
    dropped = listed(smaller, "--app", "clock:queue")
    assert dropped["clock.tick"]["state"] == "not in app"


def test_recurring_with_none_says_so(dsn: str, schema: str) -> None:
    result = run_pgqueue("recurring", "--dsn", dsn, "--schema", schema)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("no recurring jobs")
