"""What a steady point costs in CPU: processes read from /proc, the server's backends sampled
from pg_stat_activity, and pg_stat_statements' execution time where the extension is there;
and what it writes: transactions that wrote and WAL bytes, from the server's own counters.

Owns: reading utime + stime of a pid (/proc/PID/stat, Linux), a sampler thread that keeps the
last CPU figure seen for each backend of the bench's database (a backend that exits keeps the
figure last read, so short-lived connections are counted up to their last sample), and the
sum of pg_stat_statements' total_exec_time for that database. On another machine than the
server, or without /proc, the server's figures are None and the results say why.
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import psycopg

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 0.2


def process_seconds(pid: int) -> float | None:
    """utime + stime of `pid` in seconds, or None if /proc does not show it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of proc(5)


def children_seconds() -> float:
    """utime + stime of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except OSError:
        return False


class BackendSampler:
    """CPU seconds the server's backends for this database spent between start() and stop()."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, conn: psycopg.Connection, baseline: bool = False) -> None:
        """Each backend's CPU now; one first seen after the baseline counts from zero."""
        pids = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
        for (pid,) in pids:
            if not _is_postgres(pid):
                continue
            seconds = process_seconds(pid)
            if seconds is not None:
                self.first.setdefault(pid, seconds if baseline else 0.0)
                self.last[pid] = seconds

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while True:
                self._sample(conn)
                if self.stopping.wait(SAMPLE_SECONDS):
                    self._sample(conn)
                    return

    def start(self) -> BackendSampler:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self._sample(conn, baseline=True)
        self.thread.start()
        return self

    def stop(self) -> float | None:
        """The CPU seconds, or None where the backends' /proc is not readable from here."""
        self.stopping.set()
        self.thread.join(10)
        if not self.last:
            return None
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


def statements_unavailable(dsn: str) -> str | None:
    """None if pg_stat_statements can be read in this database (created here if the server
    preloads it), else why not."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        preload = conn.execute("SHOW shared_preload_libraries").fetchone()
        if "pg_stat_statements" not in str(preload[0] if preload else ""):
            return "pg_stat_statements is not in shared_preload_libraries on this server"
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except psycopg.Error as exc:
            return f"pg_stat_statements cannot be read: {exc}".strip()
    return None


def statements_ms(dsn: str) -> float:
    """pg_stat_statements' total execution time in this database so far, ms (the bench's
    own reads of the statistics views left out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT LIKE '%%pg_stat_%%'"
        ).fetchone()
    return float(row[0]) if row else 0.0


def write_counters(dsn: str) -> tuple[int, int]:
    """The next transaction id to be assigned and the WAL position in bytes, server-wide.

    Only a transaction that writes gets an id, and reading the snapshot's xmax assigns none,
    so the difference between two readings counts the writing transactions between them,
    exactly and at once (pg_stat_database's counters reach the view up to seconds late)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint,"
            " (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def writes(before: tuple[int, int], after: tuple[int, int]) -> dict[str, int]:
    return {"xacts": after[0] - before[0], "wal_bytes": after[1] - before[1]}
