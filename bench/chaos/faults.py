"""The chaos suite's processes and faults: worker and producer processes, and what hits them.

Owns: starting bench processes (each dies with the bench: PR_SET_PDEATHSIG on Linux), the
pool of worker processes of one run, the fault injectors (SIGKILL a worker in mid-batch,
terminate every pgqueue backend, restart the server) and the long REPEATABLE READ
transaction. Every process started here is stopped by `WorkerPool.stop` or `stop_process`;
nothing here decides what a run measures (bench/chaos/count.py does).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.chaos.app import backends_of

ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_SECONDS = 30.0
KILL_WAIT_SECONDS = 3.0  # how long a kill waits for its victim to have a job in flight
ADMIN_RETRY_SECONDS = 90.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL if the bench dies, so nothing is orphaned."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(module: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m module args...` from the repository root, its output appended to `log`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )


def stop_process(
    process: subprocess.Popen[bytes], timeout: float, *, signalled: bool = False
) -> int:
    """SIGTERM (unless `signalled` already), wait up to `timeout`, then SIGKILL; returns the
    exit code (negative: the signal that ended it). One SIGTERM only: a second one tells a
    pgqueue worker to skip its grace period."""
    if process.poll() is None:
        if not signalled:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


class Admin:
    """The bench's own autocommit connection, reopened while the server restarts."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] | None = None

    def rows(self, statement: Any, params: Any = None) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + ADMIN_RETRY_SECONDS
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(
                        self.dsn, autocommit=True, application_name="chaos:admin"
                    )
                cur = self.conn.execute(statement, params)
                return cur.fetchall() if cur.description is not None else []
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def value(self, statement: Any, params: Any = None) -> Any:
        return self.rows(statement, params)[0][0]

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None


class WorkerPool:
    """The worker processes of one run; every one started is stopped by `stop`."""

    def __init__(
        self, dsn: str, schema: str, mode: str, run_dir: Path, settings: dict[str, Any]
    ) -> None:
        self.args = [dsn, schema, mode, str(run_dir), json.dumps(settings)]
        self.run_dir = run_dir
        self.live: list[subprocess.Popen[bytes]] = []
        self.killed: list[subprocess.Popen[bytes]] = []
        self.exited: list[dict[str, Any]] = []  # workers that died without being killed
        self.stop_codes: list[int] = []
        self.started = 0

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = self.run_dir / f"worker-{self.started}.log"
        process = spawn("bench.chaos.worker", self.args, log)
        self.live.append(process)
        return process

    def kill(self, victim: subprocess.Popen[bytes]) -> None:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.live.remove(victim)
        self.killed.append(victim)

    def check(self) -> None:
        """Note any worker that exited on its own (a crash: workers only stop when told)."""
        for process in list(self.live):
            if process.poll() is not None:
                self.live.remove(process)
                self.exited.append({"pid": process.pid, "code": process.returncode})

    def stop(self) -> None:
        for process in self.live:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in self.live:
            self.stop_codes.append(stop_process(process, STOP_TIMEOUT_SECONDS, signalled=True))
        self.live = []


def wait_registered(admin: Admin, schema: str, pool: WorkerPool, timeout: float = 60.0) -> None:
    """Wait until each live worker process has registered (its row in the workers table); a
    worker that exits meanwhile is noted by the pool instead."""
    statement = sql.SQL("SELECT count(DISTINCT pid) FROM {}.workers WHERE pid = ANY(%s)").format(
        sql.Identifier(schema)
    )
    deadline = time.monotonic() + timeout
    while True:
        pool.check()
        pids = [p.pid for p in pool.live]
        if admin.value(statement, [pids]) >= len(pids):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {pids} did not register within {timeout:g} s")
        time.sleep(0.05)


def in_flight(admin: Admin, schema: str, mode: str, run_dir: Path, pid: int) -> int:
    """Jobs worker process `pid` is running now: its running rows (lease), or its atomic
    connections with an open write transaction (atomic jobs look queued until they commit)."""
    if mode == "lease":
        statement = sql.SQL(
            "SELECT count(*) FROM {0}.jobs WHERE status = 'running' AND worker_id ="
            " (SELECT max(id) FROM {0}.workers WHERE pid = %s)"
        ).format(sql.Identifier(schema))
        return int(admin.value(statement, [pid]))
    backends = backends_of(run_dir, pid)
    if not backends:
        return 0
    return int(
        admin.value(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND backend_xid IS NOT NULL",
            [backends],
        )
    )


def kill_mid_batch(admin: Admin, pool: WorkerPool, schema: str, mode: str) -> dict[str, Any]:
    """SIGKILL the longest-lived worker once it has a job in flight (or after a short wait),
    and start its replacement."""
    victim = pool.live[0]
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    jobs = in_flight(admin, schema, mode, pool.run_dir, victim.pid)
    while jobs == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
        jobs = in_flight(admin, schema, mode, pool.run_dir, victim.pid)
    pool.kill(victim)
    replacement = pool.start()
    return {"fault": "kill9", "pid": victim.pid, "in_flight": jobs, "replacement": replacement.pid}


def terminate_backends(admin: Admin) -> dict[str, Any]:
    """pg_terminate_backend every pgqueue session of this database (the bench's own one)."""
    rows = admin.rows(
        "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name LIKE 'pgqueue:%' AND datname = current_database()"
        " AND pid <> pg_backend_pid()"
    )
    return {"fault": "terminate", "backends": sum(1 for _, ok in rows if ok)}


class LongTransaction:
    """A REPEATABLE READ transaction that took its snapshot and then sits idle."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.conn = psycopg.connect(dsn, application_name="chaos:longtx")
        self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self.conn.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema)))
        self.started = time.monotonic()

    def finish(self) -> dict[str, Any]:
        """End it; reports how long it was held and whether it was still open at the end."""
        held = time.monotonic() - self.started
        try:
            self.conn.execute("SELECT 1")
            alive = True
        except psycopg.Error:
            alive = False
        with contextlib.suppress(psycopg.Error):
            self.conn.rollback()
        self.conn.close()
        return {"fault": "longtx", "held_s": round(held, 1), "open_at_end": alive}
