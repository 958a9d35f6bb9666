"""The examples of each integration (examples/sqlalchemy_orders, examples/sql_trigger,
examples/django_shop, examples/fastapi_shop), run as a user runs them: one command, on the
embedded PostgreSQL they start when no DATABASE_URL is set, each in a copy of its folder so
that its data folder is the test's. Each spawns a real worker process."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_python

EXAMPLES = ROOT / "examples"


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder, ignore=shutil.ignore_patterns(".pgqueue"))
    return folder


def _run(folder: Path, script: str) -> str:
    return str(_ran(folder, script).stdout)


def _ran(folder: Path, script: str) -> Any:
    ran = run_python(script, cwd=folder, env={"PYTHONPATH": f"{ROOT}:{folder}"}, timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran


def test_sqlalchemy_orders_ship_what_committed(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy", reason="pip install 'pgqueue-py[sqlalchemy]'")
    out = _run(_copy("sqlalchemy_orders", tmp_path), "orders.py")
    # cake rolled back with its job; bun's savepoint rolled back inside jam's transaction.
    assert out.splitlines() == ["order tea: shipped", "order jam: shipped"]


def test_the_documented_trigger_enqueues_a_welcome_mail_per_committed_user(tmp_path: Path) -> None:
    folder = _copy("sql_trigger", tmp_path)
    out = _run(folder, "welcome.py")
    lines = out.splitlines()
    assert [line.split()[2].rstrip(":") for line in lines] == [
        "ada@example.com",
        "cy@example.com",
        "dee@example.com",
        "eve@example.com",
    ]
    assert all(", 'welcome mail to " in line and "succeeded" in line for line in lines), out
    # The SQL how-to shows this trigger as it is run here.
    page = (ROOT / "docs" / "how-to" / "sql.md").read_text()
    assert (EXAMPLES / "sql_trigger" / "welcome.sql").read_text().strip() in page


def test_django_signups_get_their_welcome_through_django_tasks(tmp_path: Path) -> None:
    pytest.importorskip(
        "django.tasks",
        reason="django.tasks needs Django 6, which needs Python 3.12: .ci/run runs this "
        "file in .venv-django (make test-django)",
    )
    ran = _ran(_copy("django_shop", tmp_path), "run.py")
    # `--queues all` served the task's queue, `mail`, and nothing warned of a queue.
    assert "queues=default,mail " in ran.stderr
    assert "warning" not in ran.stderr.lower(), ran.stderr
    assert ran.stdout.splitlines() == [
        "before the worker:",
        "  ada@example.com: READY",
        "  bob@example.com: no job (rolled back with the signup)",
        "  cy@example.com: READY",
        "  dee@example.com: no job (rolled back with the signup)",
        "after the worker:",
        "  ada@example.com: SUCCESSFUL, 'welcome mail sent to ada@example.com'",
        "  cy@example.com: SUCCESSFUL, 'welcome mail sent to cy@example.com'",
        "welcomed: ada@example.com, cy@example.com",
    ]


def test_the_fastapi_shop_in_one_command_sends_its_receipt(tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="pip install fastapi uvicorn (the dev extra has them)")
    import json
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from tests.conftest import env_without_dsn

    folder = _copy("fastapi_shop", tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = env_without_dsn({"PYTHONPATH": f"{ROOT}:{folder}", "SHOP_PORT": str(port)})
    env.pop("SHOP_DSN", None)
    log = tmp_path / "shop.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "shop.py"], cwd=folder, env=env, stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"

    def call(method: str, path: str) -> dict[str, object]:
        request = urllib.request.Request(base + path, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, object] = json.loads(response.read())
            return answer

    try:
        deadline = time.monotonic() + 120
        while True:  # until it serves
            try:
                placed = call("POST", "/orders?item=tea")
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        while not call("GET", f"/orders/{placed['order']}")["receipt_sent"]:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
    finally:
        server.terminate()
        server.wait(60)
        left_running = _stop_embedded(folder / ".pgqueue")
    assert not left_running, "the app's shutdown left its embedded PostgreSQL running"


def _stop_embedded(data: Path) -> bool:
    """Stop an embedded server the app left running (a fast shutdown of its postmaster), so
    that no test leaves one behind; whether there was one."""
    import os
    import signal

    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return False
    with contextlib.suppress(ProcessLookupError, ValueError):
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
    return True
