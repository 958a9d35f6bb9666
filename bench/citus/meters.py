"""The Citus bench's meters: what each server has spent so far, and its cost per job between
two readings.

Owns: a server's CPU (its processes' user and system time, from /proc: the postmaster, its
live children, and through the postmaster's cumulative times the children that have
exited), WAL (its position) and statements (pg_stat_statements' calls).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass(frozen=True)
class Meter:
    """One server, as the bench reads it."""

    role: str  # single, coordinator, node1, node2
    dsn: str
    data: Path


@dataclass(frozen=True)
class Reading:
    cpu: float  # seconds of its processes, user and system
    wal: int  # bytes
    statements: int


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def cpu_seconds(data: Path) -> float:
    """User and system time of the server's postmaster, its live children, and (through the
    postmaster's cumulative times) the children that have exited."""
    pid = int((data / "postmaster.pid").read_text().split()[0])
    own = _stat(pid)
    assert own is not None, f"no postmaster {pid} for {data}"
    ticks = sum(int(v) for v in own[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and int(found[1]) == pid:
                ticks += int(found[11]) + int(found[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def read(meter: Meter) -> Reading:
    with psycopg.connect(meter.dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,"
            " (SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements)"
        ).fetchone()
    assert row is not None
    return Reading(cpu_seconds(meter.data), int(row[0]), int(row[1]))


def readings(meters: Sequence[Meter]) -> dict[str, Reading]:
    return {m.role: read(m) for m in meters}


def per_job(
    before: dict[str, Reading], after: dict[str, Reading], jobs: int
) -> dict[str, dict[str, float]]:
    """Each server's CPU (ms), WAL (bytes) and statements per job between two readings (the
    two reads' own statements taken off)."""
    return {
        role: {
            "cpu_ms": round((after[role].cpu - b.cpu) * 1000 / jobs, 4),
            "wal_bytes": round((after[role].wal - b.wal) / jobs, 1),
            "statements": round((after[role].statements - b.statements - 1) / jobs, 3),
        }
        for role, b in before.items()
    }
