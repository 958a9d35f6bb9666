"""The pytest plugin that runs Django's task tests on pgqueue's backend (see __init__.py).

At start: a server (PGQUEUE_TEST_DSN, else the embedded PostgreSQL), Django set up with
settings.py and its test database made by Django's own test machinery (`migrate` applies
pgqueue's migrations). While the tests run, every TASKS they set is passed through
backends.pgqueue_tasks; their SimpleTestCases may use the database, which a database
backend needs; each test starts with no jobs. EXCLUDED tests are skipped with their reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.django_suite.exclusions import EXCLUDED

_stack = contextlib.ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    dsn = _stack.enter_context(_server())
    os.environ["DJANGO_TEST_DSN"] = dsn
    os.environ["DJANGO_TEST_DATABASE"] = f"pgq_django_suite_{uuid.uuid4().hex[:12]}"
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_suite.settings"
    import django
    from django.core.signals import setting_changed
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    django.setup()
    setup_test_environment()
    _stack.callback(teardown_test_environment)
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    _stack.callback(connection.creation.destroy_test_db, old_name, verbosity=0)
    setting_changed.connect(_tasks_on_pgqueue)


def pytest_unconfigure(config: pytest.Config) -> None:
    from django.core.signals import setting_changed

    setting_changed.disconnect(_tasks_on_pgqueue)
    _stack.close()


def pytest_report_header() -> str:
    import django

    given = os.environ.get("PGQUEUE_TEST_DSN")
    where = given or "embedded PostgreSQL (temporary)"
    return f"Django {django.get_version()}'s tests/tasks on pgqueue's backend; database: {where}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.test import SimpleTestCase, TransactionTestCase

    seen = set()
    for item in items:
        cls = getattr(item, "cls", None)
        if cls and issubclass(cls, SimpleTestCase) and not issubclass(cls, TransactionTestCase):
            cls.databases = {"default"}  # jobs live in the database
        key = f"{item.path.name}::{cls.__name__ if cls else ''}::{item.name}"
        if key in EXCLUDED:
            seen.add(key)
            item.add_marker(pytest.mark.skip(reason=f"{key}: {EXCLUDED[key]}"))
    stale = sorted(set(EXCLUDED) - seen)
    if stale:
        raise pytest.UsageError(f"exclusions.py names tests Django's suite lacks: {stale}")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each test starts with no jobs, as a test database rolled back to empty would."""
    from pgqueue.contrib import django as integration

    schema = sql.Identifier(integration.queue().schema)
    with psycopg.connect(integration.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}.jobs").format(schema))
        conn.execute(sql.SQL("DELETE FROM {}.job_history").format(schema))


def _tasks_on_pgqueue(*, setting: str, enter: bool, **kwargs: Any) -> None:
    """Every TASKS a test sets, with pgqueue's backends in the place of Django's."""
    if setting != "TASKS" or not enter:
        return  # leaving an override restores the TASKS this mapped on entering it
    from django.conf import settings
    from django.tasks.signals import clear_tasks_handlers

    from tests.django_suite.backends import pgqueue_tasks

    settings.TASKS = pgqueue_tasks(settings.TASKS)
    clear_tasks_handlers(setting="TASKS")  # Django's receiver ran first, on the unmapped one


@contextlib.contextmanager
def _server() -> Iterator[str]:
    given = os.environ.get("PGQUEUE_TEST_DSN")
    if given:
        yield given
        return
    from pgqueue import embedded

    with tempfile.TemporaryDirectory(prefix="pgqueue-django-suite-") as folder:
        server = embedded.start(Path(folder) / "data")
        print(f"started the embedded PostgreSQL in {server.data_dir}", file=sys.__stderr__)
        try:
            yield server.dsn
        finally:
            server.stop()
