"""A worker started by `pgqueue worker --processes N`: what its supervisor tells it and what
it does with that.

Owns: the supervisor's word to its child, one environment variable the supervisor sets and
only this module reads (which child of how many, and the pipe the supervisor holds open); the
child's log tag, `[worker 2/4]` before each text line or `"process": "2/4"` in each JSON one;
its watch on the supervisor.

Invariants: the variable is removed from the child's environment once read, so the processes
a job starts are nobody's supervised worker. A child outlives its supervisor only until it
sees the pipe close: then it stops as on SIGTERM, so no worker runs on unsupervised.

Fails: a malformed variable is a UsageError (exit 2) that says to unset it.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pgqueue.cli.target import UsageError
from pgqueue.worker.observe import JsonFormatter

VARIABLE = "PGQUEUE_SUPERVISED"  # "2/4:7": worker 2 of 4, the supervisor's pipe on fd 7
_VALUE = re.compile(r"(\d+)/(\d+):(\d+)")
log = logging.getLogger("pgqueue.supervisor")


@dataclass(frozen=True)
class Supervised:
    """Worker `index` of `of`, whose supervisor holds the write end of the pipe `pipe`."""

    index: int
    of: int
    pipe: int

    @property
    def name(self) -> str:
        return f"worker {self.index}/{self.of}"

    def environ(self) -> dict[str, str]:
        """What the supervisor adds to the child's environment."""
        return {VARIABLE: f"{self.index}/{self.of}:{self.pipe}"}


def from_environ() -> Supervised | None:
    """This process's place among its supervisor's workers, or None: not supervised."""
    text = os.environ.pop(VARIABLE, None)
    if not text:
        return None
    found = _VALUE.fullmatch(text)
    if found is None:
        raise UsageError(
            f"{VARIABLE}={text!r}: only `pgqueue worker --processes` sets it; unset it"
        )
    index, of, pipe = map(int, found.groups())
    return Supervised(index, of, pipe)


def tag_logs(child: Supervised) -> None:
    """Have every line the root logger's handlers write say which worker wrote it."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if isinstance(formatter, JsonFormatter):
            formatter.fields["process"] = f"{child.index}/{child.of}"
        else:
            handler.setFormatter(_Tagged(f"[{child.name}] ", formatter))


class _Tagged(logging.Formatter):
    """Another formatter's lines, after a prefix."""

    def __init__(self, prefix: str, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.prefix = prefix
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return self.prefix + self.inner.format(record)


def watch_supervisor(child: Supervised, stop: Callable[[], None]) -> None:
    """Call `stop` once the supervisor is gone: its end of the pipe closes when its process
    ends, however it ends, and the read here returns nothing."""

    def watch() -> None:
        try:
            while os.read(child.pipe, 64):
                pass
        except OSError:
            pass
        log.warning("the supervisor is gone: stopping, as on SIGTERM")
        stop()

    threading.Thread(target=watch, name="pgqueue-supervisor-watch", daemon=True).start()
