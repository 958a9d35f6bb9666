"""The connections a worker holds do not grow with its concurrency: jobs share them. Counted
from the server's side (pg_stat_activity) on a database of the test's own, for worker
processes at concurrency 10 and 100, listening or polling only, while they run jobs. The
test application has an async atomic task: --atomic-concurrency (2) lanes, a connection each."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pgqueue import Queue
from tests.apps import tasks as apps
from tests.conftest import clean_exit_logs, count, stop_worker_processes, wait_until, worker_process


@pytest.mark.parametrize(
    ("concurrency", "poll_only", "expected"),
    [
        (10, False, {"pgqueue:claim": 1, "pgqueue:complete": 1, "pgqueue:listen": 1}),
        (100, False, {"pgqueue:claim": 1, "pgqueue:complete": 1, "pgqueue:listen": 1}),
        (100, True, {"pgqueue:claim": 1, "pgqueue:complete": 1}),
    ],
)
def test_a_worker_holds_the_same_few_connections_at_any_concurrency(
    own_database: str, tmp_path: Path, concurrency: int, poll_only: bool, expected: dict[str, int]
) -> None:
    queue = Queue(own_database, schema="conns")
    queue.migrate()
    args = ["--concurrency", str(concurrency), "--heartbeat-interval", "0.2"]
    args += ["--poll-only"] if poll_only else []
    log = tmp_path / "worker.log"
    proc = worker_process(own_database, "conns", *args, log=log)
    try:
        queue.enqueue_many([apps.sleepy.job(3.0) for _ in range(concurrency)])
        with psycopg.connect(own_database, autocommit=True) as conn:
            wait_until(
                lambda: count(conn, "conns", "jobs", "status = 'running'") == concurrency,
                what="every slot busy",
            )

            def sessions() -> dict[str, int]:
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND application_name LIKE 'pgqueue:%'"
                    # Opened for a moment at start and hourly (partitions.py), then closed.
                    " AND application_name <> 'pgqueue:partitions' GROUP BY 1"
                ).fetchall()
                return {str(r[0]): int(r[1]) for r in rows}

            # The heartbeat connects at its first beat.
            wait_until(lambda: "pgqueue:heartbeat" in sessions(), what="the first heartbeat")
            held = sessions()
            still = count(conn, "conns", "jobs", "status = 'running'")
    finally:
        queue.close()
        stop_worker_processes([proc])
    clean_exit_logs([proc], [log])
    assert still == concurrency  # counted while every slot was busy
    assert held == expected | {"pgqueue:heartbeat": 1, "pgqueue:atomic": 2}
