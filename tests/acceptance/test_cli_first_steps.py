"""The first steps a new user takes with the `pgqueue` command, as real processes: the worker
finds the application's database, says what it will not run, and every option explains itself."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import textwrap
from pathlib import Path

import psycopg
import pytest

from pgqueue import Queue
from pgqueue.cli import parser as cli_parser
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.conftest import ROOT, count, new_schema, run_python, wait_until, worker_process


def _app(folder: Path, dsn: str | None, schema: str) -> Path:
    """A small application module, as a user writes it, with its DSN given in code."""
    given = "None" if dsn is None else repr(dsn)
    (folder / "shop.py").write_text(
        textwrap.dedent(
            f"""
            from pgqueue import Queue

            queue = Queue({given}, schema={schema!r})


            @queue.task(name="shop.add", queue="math")
            def add(a: int, b: int) -> int:
                return a + b


            @queue.task(name="shop.ping")
            def ping() -> str:
                return "pong"
            """
        )
    )
    return folder


def _run_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(ROOT), str(folder)])
    result: subprocess.CompletedProcess[str] = run_python(
        "-m", "pgqueue", *args, cwd=folder, env={"PYTHONPATH": path}
    )
    return result


def test_the_worker_uses_the_dsn_the_application_gave_its_queue(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    folder = _app(tmp_path, dsn, schema)
    queue = Queue(dsn, schema=schema)
    ping = queue.declare("shop.ping")
    job_id = ping.enqueue()
    result = _run_in(folder, "worker", "shop:queue", "--burst")
    assert result.returncode == 0, result.stderr
    assert "embedded" not in result.stderr
    job = queue.get_job(job_id)
    assert job is not None and job.result == "pong"
    queue.close()


def test_a_worker_warns_about_tasks_on_queues_it_does_not_serve_and_all_serves_them(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    folder = _app(tmp_path, dsn, schema)
    queue = Queue(dsn, schema=schema)
    add = queue.declare("shop.add", queue="math")
    job_id = add.enqueue(a=1, b=2)

    default_only = _run_in(folder, "worker", "shop:queue", "--burst")
    assert default_only.returncode == 0, default_only.stderr
    assert "queues=default" in default_only.stderr
    assert "task 'shop.add' runs on queue 'math', which this worker does not serve" in (
        default_only.stderr
    )
    assert "--queues math (or --queues all)" in default_only.stderr
    still = queue.get_job(job_id)
    assert still is not None and still.status == "queued"

    every = _run_in(folder, "worker", "shop:queue", "--burst", "--queues", "all")
    assert every.returncode == 0, every.stderr
    assert "queues=default,math" in every.stderr
    assert "does not serve" not in every.stderr
    done = queue.get_job(job_id)
    assert done is not None and done.result == 3
    queue.close()


def test_a_worker_on_an_unmigrated_schema_names_the_migrate_command_for_it(dsn: str) -> None:
    result = run_pgqueue(
        "worker",
        "tests.apps.tasks:queue",
        "--dsn",
        dsn,
        "--schema",
        "pgq_never_migrated",
        "--burst",
    )
    assert result.returncode == 1, result.stderr
    # The error alone: no worker started, so no "worker ... stopped" line before it.
    assert result.stderr.splitlines() == [
        "pgqueue: error: schema 'pgq_never_migrated' has no pgqueue tables: run "
        "`pgqueue migrate --schema pgq_never_migrated` first"
    ]


def test_version_and_a_top_level_help_for_users() -> None:
    version = run_pgqueue("--version")
    assert version.returncode == 0 and version.stdout.startswith("pgqueue "), version
    helped = run_pgqueue("--help")
    assert helped.returncode == 0
    assert "pgqueue migrate" in helped.stdout and "workers" in helped.stdout
    commands = helped.stdout.split("positional arguments:")[1].split("options:")[0]
    assert "recurring" in commands and "--app MODULE:ATTR" in helped.stdout
    assert "only module" not in helped.stdout


def test_an_unknown_flag_prints_its_subcommands_usage() -> None:
    result = run_pgqueue("worker", "tests.apps.tasks:queue", "--bogus")
    assert_usage_error(result, "usage: pgqueue worker", "unrecognized arguments: --bogus")


def test_options_are_taken_before_or_after_the_subcommand(dsn: str, schema: str) -> None:
    after = run_pgqueue(
        "status", "--json", "--schema", schema, "--dsn", dsn, "--log-level", "debug"
    )
    before = run_pgqueue("--log-level", "warning", "--dsn", dsn, "--schema", schema, "status")
    assert after.returncode == 0, after.stderr
    assert before.returncode == 0, before.stderr
    assert json.loads(after.stdout)["schema_name"] == schema
    assert f"queues in schema {schema}" in before.stdout or "no live jobs" in before.stdout


def _options(parser: argparse.ArgumentParser, path: str = "pgqueue") -> list[tuple[str, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{path} {name}")
        elif action.option_strings and action.dest != "help":
            found.append((f"{path} {action.option_strings[0]}", action.help or ""))
    return found


def test_every_option_of_every_command_has_help_text() -> None:
    options = _options(cli_parser.build())
    assert len(options) > 60
    assert [name for name, text in options if not text.strip()] == []


def test_the_workers_help_shows_each_default() -> None:
    text = run_pgqueue("worker", "--help").stdout
    for fragment in (
        "jobs run at once (default: 10)",
        "jobs claimed per statement, at most (default: 100)",
        "(default: default)",
        "how often to look for jobs without a wake-up (default: 1.0)",
        "how long running jobs get to finish on stop (default: 30.0)",
    ):
        assert fragment in " ".join(text.split()), fragment


def test_absurd_worker_intervals_are_refused_naming_the_limit(dsn: str, schema: str) -> None:
    for flag, value, text in (
        ("--poll-interval", "1e12", "poll_interval must be at most 3600 seconds"),
        ("--lease-timeout", "1e10", "lease_timeout must be at most 1 days"),
        ("--claim-cooldown", "5", "claim_cooldown must be from 0 seconds"),
    ):
        result = run_pgqueue(
            "worker", "tests.apps.tasks:queue", "--dsn", dsn, "--schema", schema, flag, value
        )
        assert_usage_error(result, text)


def test_workers_lists_each_live_worker(dsn: str, schema: str, tmp_path: Path) -> None:
    proc = worker_process(dsn, schema, "--queues", "default,mail", log=tmp_path / "w.log")
    try:

        def listed() -> list[dict[str, object]]:
            shown = run_pgqueue("workers", "--json", "--dsn", dsn, "--schema", schema)
            assert shown.returncode == 0, shown.stderr
            rows: list[dict[str, object]] = json.loads(shown.stdout)
            return rows

        wait_until(lambda: len(listed()) == 1, what="the worker's row")
        (row,) = listed()
        assert row["pid"] == proc.pid and row["queues"] == ["default", "mail"]
        assert row["running"] == 0 and row["concurrency"] == 10
        table = run_pgqueue("workers", "--dsn", dsn, "--schema", schema, env={"COLUMNS": "80"})
        assert table.returncode == 0, table.stderr
        assert str(proc.pid) in table.stdout and "default,mail" in table.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_prune_of_the_whole_history_needs_yes(dsn: str) -> None:
    schema = new_schema(dsn)
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".job_history (id, queue, task, args, status, priority, '
            "attempt, max_attempts, run_at, created_at, finished_at, errors) VALUES "
            "(1, 'default', 't', '{}', 'succeeded', 0, 1, 1, now(), now(), now() - interval '1 s', "
            "'[]')"
        )
        conn.commit()
        refused = run_pgqueue("prune", "--older-than", "0", "--dsn", dsn, "--schema", schema)
        assert_usage_error(refused, "pass --yes to confirm")
        assert count(conn, schema, "job_history") == 1
        done = run_pgqueue("prune", "--older-than", "0", "--yes", "--dsn", dsn, "--schema", schema)
        assert done.returncode == 0, done.stderr
        assert count(conn, schema, "job_history") == 0
    queue.close()


@pytest.mark.parametrize("args", [["jobs", "list", "--bogus"], ["tenants", "list", "--nope"]])
def test_nested_subcommands_print_their_own_usage(args: list[str]) -> None:
    result = run_pgqueue(*args)
    assert_usage_error(result, f"usage: pgqueue {' '.join(args[:2])}")
