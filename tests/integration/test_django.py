"""pgqueue.contrib.django in a real Django project (tests/django_project) on a database of
the test's own: `manage.py migrate` sets pgqueue up, jobs enqueued with no `conn=` commit
and roll back with `transaction.atomic()` blocks and their savepoints, and
`manage.py pgqueue_worker` runs them with the ORM at hand."""

from __future__ import annotations

import json

import psycopg
import pytest

from tests.conftest import ROOT, run_python

pytest.importorskip("django", reason="pip install django (the dev extra has it)")

PROJECT = ROOT / "tests" / "django_project"


def _manage(dsn: str, *args: str) -> object:
    env = {"DJANGO_TEST_DSN": dsn, "PYTHONPATH": f"{ROOT}:{PROJECT}"}
    return run_python(*args, cwd=PROJECT, env=env, timeout=180)


def test_migrate_enqueue_in_atomic_blocks_and_the_worker(own_database: str) -> None:
    migrated = _manage(own_database, "manage.py", "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr  # type: ignore[attr-defined]
    again = _manage(own_database, "manage.py", "pgqueue_migrate")
    assert "nothing to apply" in again.stdout, again.stderr  # type: ignore[attr-defined]

    ran = _manage(own_database, "scenarios.py")
    assert ran.returncode == 0, ran.stderr  # type: ignore[attr-defined]
    seen = json.loads(ran.stdout)  # type: ignore[attr-defined]
    # The rolled-back block's job and the inner savepoint's job are gone with their orders.
    assert seen["jobs"] == sorted([seen["committed"], seen["outer"], seen["autocommit"]])
    assert seen["orders"] == ["jam", "pie", "tea"]

    worked = _manage(own_database, "manage.py", "pgqueue_worker", "--burst")
    assert worked.returncode == 0, worked.stderr  # type: ignore[attr-defined]
    with psycopg.connect(own_database) as conn:
        sent = conn.execute(
            "SELECT item FROM shop_order WHERE receipt_sent ORDER BY item"
        ).fetchall()
        done = conn.execute(
            "SELECT count(*) FROM pgqueue.job_history WHERE status = 'succeeded'"
        ).fetchone()
    assert [r[0] for r in sent] == ["jam", "pie", "tea"]
    assert done == (3,)


def test_a_project_without_the_setting_is_told_what_to_set(own_database: str) -> None:
    env = {
        "DJANGO_TEST_DSN": own_database,
        "PYTHONPATH": f"{ROOT}:{PROJECT}",
        "DJANGO_SETTINGS_MODULE": "settings_without_pgqueue",
    }
    ran = run_python("manage.py", "check", cwd=PROJECT, env=env, timeout=120)
    assert ran.returncode != 0
    assert "ConfigurationError" in ran.stderr
    assert 'PGQUEUE = {"QUEUE": "yourapp.jobs:queue"}' in ran.stderr


def test_pgqueue_worker_with_two_processes_runs_each_as_the_same_command(
    own_database: str,
) -> None:
    migrated = _manage(own_database, "manage.py", "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr  # type: ignore[attr-defined]
    ran = _manage(own_database, "scenarios.py")
    assert ran.returncode == 0, ran.stderr  # type: ignore[attr-defined]

    worked = _manage(own_database, "manage.py", "pgqueue_worker", "--processes", "2", "--burst")
    err = worked.stderr  # type: ignore[attr-defined]
    assert worked.returncode == 0, err  # type: ignore[attr-defined]
    # Both children started, each a Django process: its lines carry its tag.
    assert "[worker 1/2]" in err and "[worker 2/2]" in err, err
    with psycopg.connect(own_database) as conn:
        sent = conn.execute(
            "SELECT item FROM shop_order WHERE receipt_sent ORDER BY item"
        ).fetchall()
    assert [r[0] for r in sent] == ["jam", "pie", "tea"]
