"""`pgqueue worker --processes N`: one supervisor and the N worker processes it owns.

Owns: its children, each the supervisor's own command line (`python -m pgqueue worker ...`,
or `manage.py pgqueue_worker ...`) with `--processes 1` (a fresh interpreter that inherits
only the environment and the working directory), which it alone starts, restarts and stops;
the private metrics port of each (pgqueue/cli/merged_metrics.py serves their sum).

Invariants: a child that ends while the supervisor runs is started again after a backoff that
doubles from 1 s to 30 s and starts over once a child has lived a minute; with --burst a child
that ends is done. Each SIGTERM or SIGINT is passed on to every child as SIGTERM: the first
stops each with its grace, a second at once. The children run in sessions of their own, so
a terminal's Ctrl-C reaches them once, through the supervisor; if the supervisor itself is
killed they see its pipe close and stop gracefully (pgqueue/cli/supervised.py).

Fails: exit 1 when a child failed (a non-zero exit or a signal) under --burst or while
stopping, else 0. A child that fails at once keeps being restarted, at most every 30 s, each
restart logged with how it ended.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from pgqueue.cli.supervised import Supervised

if TYPE_CHECKING:
    from pgqueue.cli.merged_metrics import ChildrenCollector

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
STEADY_SECONDS = 60.0  # a child that lived this long restarts after the first backoff again
TICK_SECONDS = 0.2  # how soon an ended child or a signal is acted on
log = logging.getLogger("pgqueue.supervisor")


def cores() -> int:
    """The cores this process may run on: `--processes auto`."""
    count = getattr(os, "process_cpu_count", os.cpu_count)()
    return max(int(count or 1), 1)


@dataclass
class Child:
    """One worker process's place: the process now in it, and when to start the next."""

    slot: Supervised
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0  # in a row, each sooner than STEADY_SECONDS after its start
    due: float | None = 0.0  # when to start it (again); None: never again
    signalled: int = 0  # the signals passed on to this process


class Supervisor:
    """Runs `processes` workers, each the command line `command`, until they are done or
    stopped."""

    def __init__(
        self,
        command: list[str],
        processes: int,
        *,
        burst: bool,
        dsn: str,
        metrics: ChildrenCollector | None = None,
    ) -> None:
        self.command = command
        self.burst = burst
        self.dsn = dsn
        self.metrics = metrics
        self._read, self._write = os.pipe()  # the children's sign of life of the supervisor
        self.children = [
            Child(Supervised(i, processes, self._read)) for i in range(1, processes + 1)
        ]
        self.signals: list[signal.Signals] = []
        self._logged = 0  # the signals logged
        self.failed = False

    def run(self) -> int:
        """Start the workers and watch them; the exit code once all have ended."""
        log.info("starting %d worker processes", len(self.children))
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOPS}
        try:
            while self._tick():
                time.sleep(TICK_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self._read)
            os.close(self._write)
        return 1 if self.failed else 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only noted here: the loop passes it on, so a child started meanwhile gets it too.
        self.signals.append(signal.Signals(signum))
        for child in self.children:
            child.due = None

    def _tick(self) -> bool:
        """One look at the children; whether any runs or waits to start."""
        now = time.monotonic()
        self._pass_signals()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                self._ended(child, now)
            if child.proc is None and child.due is not None and child.due <= now:
                self._start(child, now)
        return any(c.proc is not None or c.due is not None for c in self.children)

    def _pass_signals(self) -> None:
        for sig in self.signals[self._logged :]:
            log.warning(
                "received %s: %s",
                sig.name,
                "stopping the workers now, each putting its running jobs back"
                if self._logged
                else "stopping the workers, each giving its running jobs its grace "
                "(signal again to stop them now)",
            )
            self._logged += 1
        for child in self.children:
            # One a tick: two sent at once may reach the process as one, the kernel keeping
            # one pending signal of a kind.
            if child.proc is not None and child.signalled < len(self.signals):
                child.proc.send_signal(signal.SIGTERM)
                child.signalled += 1

    def _start(self, child: Child, now: float) -> None:
        env = os.environ | {"PGQUEUE_DSN": self.dsn} | child.slot.environ()
        command = [*self.command, "--processes", "1"]
        if self.metrics is not None:
            port = _free_port()
            command += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
            self.metrics.watch(child.slot.index, port)
        child.proc = subprocess.Popen(
            command, env=env, pass_fds=(self._read,), start_new_session=True
        )
        child.started, child.signalled = now, 0
        log.info("%s started, pid %d", child.slot.name, child.proc.pid)

    def _ended(self, child: Child, now: float) -> None:
        assert child.proc is not None
        code, pid = child.proc.returncode, child.proc.pid
        child.proc = None
        if self.metrics is not None:
            self.metrics.retire(child.slot.index)
        if self.signals or self.burst:
            self._done(child, pid, code)
        else:
            self._restart_later(child, pid, code, now)

    def _done(self, child: Child, pid: int, code: int) -> None:
        child.due = None
        # A worker still starting when the SIGTERM passed on reached it had no handler yet:
        # it ended by the stop asked for, not by a fault.
        stopped = bool(self.signals) and code == -signal.SIGTERM
        self.failed |= code != 0 and not stopped
        level = logging.INFO if code == 0 or stopped else logging.WARNING
        log.log(level, "%s (pid %d) ended: %s", child.slot.name, pid, how_it_ended(code))

    def _restart_later(self, child: Child, pid: int, code: int, now: float) -> None:
        lived = now - child.started
        if lived >= STEADY_SECONDS:
            child.restarts = 0
        delay = min(FIRST_BACKOFF_SECONDS * 2**child.restarts, MAX_BACKOFF_SECONDS)
        child.restarts += 1
        child.due = now + delay
        log.warning(
            "%s (pid %d) ended unexpectedly after %.1f s: %s; restarting it in %g s",
            child.slot.name,
            pid,
            lived,
            how_it_ended(code),
            delay,
        )


_STOPS = (signal.SIGTERM, signal.SIGINT)


def how_it_ended(code: int) -> str:
    """A process's return code in words: `exit 1`, `killed by SIGKILL`."""
    if code >= 0:
        return f"exit {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now, for a child's own metrics. Should another
    process take it first, the child cannot listen, exits 2 and is restarted on another."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
