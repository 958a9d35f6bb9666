"""What one phase of the lifecycle bench cost in CPU, on both sides of the wire.

Owns: the client's CPU seconds (the worker process, a child of the bench, from the children's
rusage; or the bench's own thread, for the phases it runs itself) and the server's: every
process of the PostgreSQL server (the postmaster, its backends and helpers, read from /proc)
plus what its children that ended meanwhile had spent (the postmaster's cutime and cstime), so
a worker's backends that exit with it are counted whole. The server is found as the parent of
the bench connection's backend; on another machine, or without /proc, its figure is None and
the results say so.

Both sides share the machine's cores, so these say where a drain's time goes when the SQL alone
runs faster than the worker: a client that spends as much CPU per job as the server leaves the
server half the cores it would have with a client that spends none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from bench.steady.cpu import TICKS, children_seconds

REAP_TRIES, REAP_PAUSE = 200, 0.01


def _stat(pid: int) -> list[str] | None:
    """Fields 3 and on of /proc/PID/stat (state first), or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _server_seconds(postmaster: int) -> float | None:
    """CPU seconds the server has spent so far: its live processes' own, and those of the
    processes the postmaster has reaped. A backend that has exited but is not yet reaped
    shows no CPU of its own, and one reaped while its siblings are read would be counted in
    neither place: the reading is taken again until no child is waiting to be reaped and the
    reaped children's total is the same before and after it."""
    for _ in range(REAP_TRIES):
        before = _stat(postmaster)
        if before is None:
            return None
        total = 0
        settled = True
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == postmaster:
                continue
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == postmaster:  # its parent, field 4
                settled = settled and fields[0] != "Z"
                total += int(fields[11]) + int(fields[12])
        after = _stat(postmaster)
        # proc(5): utime 14, stime 15, cutime 16, cstime 17; here counted from field 3.
        if after is not None and settled and before[13:15] == after[13:15]:
            return (total + sum(int(after[i]) for i in (11, 12, 13, 14))) / TICKS
        time.sleep(REAP_PAUSE)
    return None


def postmaster_of(conn: psycopg.Connection[Any]) -> int | None:
    """The server's postmaster, if its processes can be read here."""
    fields = _stat(conn.info.backend_pid)
    return None if fields is None else int(fields[1])


@dataclass
class Clock:
    """Started before a phase, read after it."""

    postmaster: int | None
    wall: float = 0.0
    thread: float = 0.0
    children: float = 0.0
    server: float | None = None

    def start(self) -> Clock:
        self.server = None if self.postmaster is None else _server_seconds(self.postmaster)
        self.children = children_seconds()
        self.thread = time.thread_time()
        self.wall = time.perf_counter()
        return self

    def stop(self) -> dict[str, float | None]:
        """Seconds since start(): wall, the client (this thread and the processes it ran and
        waited for) and the server."""
        wall = time.perf_counter() - self.wall
        client = time.thread_time() - self.thread + children_seconds() - self.children
        now = None if self.postmaster is None else _server_seconds(self.postmaster)
        server = None if now is None or self.server is None else now - self.server
        return {"wall_s": wall, "client_cpu_s": client, "server_cpu_s": server}
