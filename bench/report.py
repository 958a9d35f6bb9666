"""Where a suite's results go and what they record, and how a suite's run ends.

A full run writes to bench/results/SUITE/pgNN/ and replaces what was there: the folder
holds the latest figures for that server, and git holds the earlier ones. A --short run
(the CI-sized one) writes to bench/out/SUITE-short/, which git ignores. Every results file
starts with the same header: the suite, the exact command, when it started and how long it
took, the server, and the host.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from bench import options
from bench.server import Server

ROOT = Path(__file__).resolve().parent


@dataclass
class Run:
    """One invocation of a suite: what it was asked, and where its results go."""

    suite: str
    argv: Sequence[str]
    out: Path | None = None
    short: bool = False
    started_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    started: float = field(default_factory=time.monotonic)

    @property
    def command(self) -> str:
        return options.command(self.suite, self.argv)

    def folder(self, server: Server) -> Path:
        """The results folder, made empty for this run unless --out named one."""
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            return self.out
        if self.short:
            found = ROOT / "out" / f"{self.suite}-short"
        else:
            found = ROOT / "results" / self.suite / server.label
        shutil.rmtree(found, ignore_errors=True)
        found.mkdir(parents=True)
        return found

    def header(self, server: Server) -> dict[str, Any]:
        return {
            "bench": self.suite,
            "command": self.command,
            "started_at": self.started_at.isoformat(timespec="seconds"),
            "runtime_s": round(time.monotonic() - self.started, 1),
            "database": server.describe(),
            "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        }

    def write(self, folder: Path, name: str, server: Server, figures: dict[str, Any]) -> Path:
        """`name` in `folder`: the header, then the suite's figures."""
        path = folder / name
        path.write_text(json.dumps(self.header(server) | figures, indent=2, default=str) + "\n")
        return path


class Terminated(BaseException):
    """SIGTERM arrived: unwind through the finally blocks that stop processes and drop data
    (a BaseException, as KeyboardInterrupt, so no `except Exception` swallows it)."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated


def guarded(suite: str, body: Callable[[], int]) -> int:
    """Run a suite's body: SIGTERM and Ctrl-C unwind it (its processes stopped, its data
    dropped) with 143 and 130; a database or setup failure is one line and exit 1."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return body()
    except (KeyboardInterrupt, Terminated) as exc:
        print(
            f"bench {suite}: stopped early; its processes stopped, its data dropped",
            file=sys.stderr,
        )
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    except (psycopg.Error, RuntimeError) as exc:
        print(f"bench {suite}: failed: {exc}", file=sys.stderr)
        return 1
