"""`--app MODULE:ATTR` (or PGQUEUE_APP) on every command, as a user's shell runs it: the app's
Queue names the database and schema unless --dsn/--schema say otherwise, a task or queue name
the app does not know draws a warning that names the close ones, and a bad --app is a usage
error. Real processes, a real PostgreSQL, an application module written as a user writes it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgqueue import Queue
from tests.acceptance.test_cli import UNREACHABLE_DSN, assert_usage_error
from tests.conftest import ROOT, drop_schema, run_python

APP = "shop:queue"


def write_app(folder: Path, dsn: str | None, schema: str) -> Path:
    """shop.py: a Queue with its DSN and schema in code, tasks on queues `math` and
    `default`."""
    (folder / "shop.py").write_text(
        textwrap.dedent(
            f"""
            from pgqueue import Queue

            queue = Queue({dsn!r}, schema={schema!r})


            @queue.task(name="shop.add", queue="math")
            def add(a: int, b: int) -> int:
                return a + b


            @queue.task(name="shop.mail")
            def mail(to: str) -> None: ...
            """
        )
    )
    return folder


def pgqueue_in(
    folder: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m pgqueue ARGS` run in `folder`, where the app module is, with no DSN
    inherited from the environment."""
    path = os.pathsep.join([str(ROOT), str(folder)])
    result: subprocess.CompletedProcess[str] = run_python(
        "-m", "pgqueue", *args, cwd=folder, env={"PYTHONPATH": path, **(env or {})}
    )
    return result


@pytest.fixture
def shop(dsn: str, schema: str, tmp_path: Path) -> Path:
    return write_app(tmp_path, dsn, schema)


@pytest.fixture
def unmade_schema(dsn: str) -> Iterator[str]:
    name = f"pgq_test_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(dsn, name)


# -- the app names the database and the schema -------------------------------------------------


def test_app_gives_every_command_its_dsn_and_schema(dsn: str, schema: str, shop: Path) -> None:
    queue = Queue(dsn, schema=schema)
    job_id = queue.enqueue(queue.declare("shop.mail").job(to="a@example.com"))
    queue.close()
    status = pgqueue_in(shop, "--app", APP, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["schema_name"] == schema
    listed = pgqueue_in(shop, "jobs", "list", "--json", env={"PGQUEUE_APP": APP})
    assert listed.returncode == 0, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)["jobs"]] == [job_id]
    assert "embedded" not in status.stderr + listed.stderr


def test_migrate_with_app_creates_the_apps_schema(
    dsn: str, unmade_schema: str, tmp_path: Path
) -> None:
    write_app(tmp_path, dsn, unmade_schema)
    result = pgqueue_in(tmp_path, "migrate", "--app", APP)
    assert result.returncode == 0, result.stderr
    assert f"schema {unmade_schema}: applied 0001_jobs" in result.stderr


def test_explicit_dsn_and_schema_win_over_the_apps(dsn: str, schema: str, shop: Path) -> None:
    other = pgqueue_in(shop, "--app", APP, "status", "--json", "--schema", "pgq_test_other")
    assert other.returncode == 1, other.stderr
    assert "schema 'pgq_test_other' has no pgqueue tables" in other.stderr
    unreachable = pgqueue_in(shop, "--app", APP, "status", "--dsn", UNREACHABLE_DSN)
    assert unreachable.returncode == 1, unreachable.stderr
    assert "cannot connect" in unreachable.stderr and "Traceback" not in unreachable.stderr


def test_pgqueue_dsn_overrides_a_dsn_written_in_the_apps_code(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    # A deployment's environment names the database; the app's code has a developer's default
    # (docker-compose.yml's worker relies on this).
    write_app(tmp_path, UNREACHABLE_DSN, schema)
    result = pgqueue_in(tmp_path, "--app", APP, "status", "--json", env={"PGQUEUE_DSN": dsn})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema_name"] == schema


def test_without_app_a_command_takes_pgqueue_dsn_then_database_url(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    for env in (
        {"PGQUEUE_DSN": dsn, "DATABASE_URL": UNREACHABLE_DSN},
        {"DATABASE_URL": dsn},
    ):
        result = pgqueue_in(tmp_path, "status", "--json", "--schema", schema, env=env)
        assert result.returncode == 0, (env, result.stderr)
        assert json.loads(result.stdout)["schema_name"] == schema


def test_an_app_without_a_dsn_reads_pgqueue_dsn_like_the_queue_does(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    write_app(tmp_path, None, schema)
    result = pgqueue_in(tmp_path, "--app", APP, "status", "--json", env={"PGQUEUE_DSN": dsn})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["schema_name"] == schema


def test_the_worker_takes_its_app_from_pgqueue_app(dsn: str, schema: str, shop: Path) -> None:
    queue = Queue(dsn, schema=schema)
    job_id = queue.enqueue(queue.declare("shop.add", queue="math").job(a=2, b=3))
    result = pgqueue_in(shop, "worker", "--queues", "math", "--burst", env={"PGQUEUE_APP": APP})
    assert result.returncode == 0, result.stderr
    job = queue.get_job(job_id)
    queue.close()
    assert job is not None and job.result == 5


def test_a_worker_without_any_app_says_how_to_name_one(tmp_path: Path) -> None:
    result = pgqueue_in(tmp_path, "worker", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(result, "pgqueue worker MODULE:ATTR", "--app", "PGQUEUE_APP")


# -- a bad --app -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("no_such_shop:queue", "cannot import 'no_such_shop': ModuleNotFoundError"),
        ("shop:nope", "module 'shop' has no attribute 'nope'"),
        ("shop:add", "is a Task, not a pgqueue Queue or AsyncQueue"),
        ("shop", "'shop' is not MODULE:ATTR"),
    ],
)
def test_a_bad_app_is_a_usage_error_naming_it(shop: Path, spec: str, says: str) -> None:
    flag = pgqueue_in(shop, "--app", spec, "status", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(flag, f"--app {spec}", says)
    env = pgqueue_in(shop, "queues", "list", env={"PGQUEUE_APP": spec})
    assert_usage_error(env, f"PGQUEUE_APP={spec}", says)


def test_two_different_apps_are_refused(shop: Path) -> None:
    result = pgqueue_in(shop, "worker", APP, "--app", "other:queue", "--dsn", UNREACHABLE_DSN)
    assert_usage_error(result, "two apps named")


# -- names the app does not know ---------------------------------------------------------------


def test_a_task_name_typo_is_done_but_warned_with_the_close_match(shop: Path) -> None:
    result = pgqueue_in(shop, "--app", APP, "rates", "set", "--task", "shop.ad", "10/m")
    assert result.returncode == 0, result.stderr
    assert "warning: the app has no task 'shop.ad'; did you mean 'shop.add'" in result.stderr
    listed = pgqueue_in(shop, "--app", APP, "rates", "list", "--json")
    assert [limit["task"] for limit in json.loads(listed.stdout)] == ["shop.ad"]
    known = pgqueue_in(shop, "--app", APP, "rates", "set", "--task", "shop.add", "10/m")
    assert known.returncode == 0 and "warning" not in known.stderr, known.stderr


def test_a_name_with_no_close_match_lists_what_the_app_has(shop: Path) -> None:
    result = pgqueue_in(shop, "--app", APP, "jobs", "list", "--task", "zzz", "--json")
    assert result.returncode == 0, result.stderr
    assert "the app has no task 'zzz' (it has shop.add, shop.mail)" in result.stderr


def test_a_worker_queue_typo_is_warned_with_the_close_match(shop: Path) -> None:
    result = pgqueue_in(shop, "worker", APP, "--queues", "maht,default", "--burst")
    assert result.returncode == 0, result.stderr
    assert "warning: the app has no queue 'maht'; did you mean 'math'?" in result.stderr
    assert "queue 'default'" not in result.stderr


def test_queue_commands_warn_of_a_queue_the_app_does_not_know(shop: Path) -> None:
    paused = pgqueue_in(shop, "--app", APP, "queues", "pause", "mathh")
    assert paused.returncode == 0, paused.stderr
    assert "the app has no queue 'mathh'; did you mean 'math'?" in paused.stderr
    assert "mathh: paused" in paused.stderr  # done all the same: it may be another app's


def test_without_an_app_names_are_taken_without_a_word(dsn: str, schema: str) -> None:
    result = run_python(
        "-m", "pgqueue", "rates", "set", "--task", "feat.smss", "10/m",
        "--dsn", dsn, "--schema", schema,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
