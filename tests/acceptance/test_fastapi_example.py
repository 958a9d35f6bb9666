"""The FastAPI example (examples/fastapi_shop) as a user runs it: uvicorn serving it as a real
process, real HTTP requests, and its worker either in the web process's lifespan or as a
`pgqueue worker` process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, count, free_port, wait_until

pytest.importorskip("fastapi", reason="pip install fastapi uvicorn (the dev extra has them)")
pytest.importorskip("uvicorn", reason="pip install fastapi uvicorn (the dev extra has them)")

EXAMPLE = ROOT / "examples" / "fastapi_shop"


def _sqlalchemy_url(dsn: str) -> str:
    for scheme in ("postgresql://", "postgres://"):
        if dsn.startswith(scheme):
            return "postgresql+psycopg://" + dsn.removeprefix(scheme)
    pytest.skip(f"the example takes a URL DSN, not {dsn!r}")
    raise AssertionError  # not reached: skip raises


def _env(dsn: str, schema: str, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(EXAMPLE)])
    return (
        os.environ
        | {"SHOP_DSN": _sqlalchemy_url(dsn), "SHOP_SCHEMA": schema}
        | {"PYTHONPATH": path}
        | extra
    )


@contextmanager
def _serving(dsn: str, schema: str, **extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "shop:app",
            "--port",
            str(port),
            "--log-level",
            "info",
        ],
        cwd=EXAMPLE,
        env=_env(dsn, schema, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _call("GET", f"{base}/orders/0")
            except urllib.error.HTTPError as served:
                served.close()  # a 404: serving
                break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"uvicorn did not start: {proc.communicate()[0]}") from exc
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        output = proc.communicate(timeout=60)[0]
        # uvicorn stops gracefully, then ends by the signal it was sent.
        assert proc.returncode in (0, -signal.SIGTERM), output
        assert "Application shutdown complete." in output, output  # the lifespan (its worker)
        assert "Traceback" not in output and "ERROR" not in output, output


def _call(method: str, url: str) -> Any:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        return json.loads(r.read())


def _order_and_job_rows(dsn: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(dsn) as conn:
        # One snapshot for the three counts: a job the worker moves to history between two
        # READ COMMITTED reads would be counted in both.
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        return (
            count(conn, schema, "shop_orders"),
            count(conn, schema, "jobs") + count(conn, schema, "job_history"),
        )


def test_a_request_enqueues_in_its_session_and_the_lifespan_worker_runs_it(
    dsn: str, schema: str
) -> None:
    with _serving(dsn, schema, SHOP_WORKER="lifespan") as base:
        placed = _call("POST", f"{base}/orders?item=tea")
        # Committed before the response: both rows are there as soon as it arrives.
        assert _order_and_job_rows(dsn, schema) == (1, 1)
        with pytest.raises(urllib.error.HTTPError) as refused:
            _call("POST", f"{base}/orders?item=forbidden")
        assert refused.value.code == 422
        refused.value.close()
        assert _order_and_job_rows(dsn, schema) == (1, 1)  # the order and its job rolled back
        wait_until(
            lambda: _call("GET", f"{base}/orders/{placed['order']}")["receipt_sent"],
            what="the lifespan worker to send the receipt",
        )


def test_the_worker_as_its_own_process(dsn: str, schema: str) -> None:
    with _serving(dsn, schema) as base:
        placed = _call("POST", f"{base}/orders?item=cake")
        time.sleep(0.5)
        assert not _call("GET", f"{base}/orders/{placed['order']}")["receipt_sent"]  # no worker
        command = ["-m", "pgqueue", "worker", "shop:queue", "--dsn", dsn, "--schema", schema]
        worker = subprocess.run(
            [sys.executable, *command, "--burst"],
            cwd=EXAMPLE,
            env=_env(dsn, schema),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stderr
        assert _call("GET", f"{base}/orders/{placed['order']}")["receipt_sent"]
