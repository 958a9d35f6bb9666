"""An application that only enqueues loads neither the command line nor its dependencies, nor
any integration (SQLAlchemy, even where it is installed)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import sys
import pgqueue
from pgqueue import Queue, AsyncQueue, Worker
Queue("postgresql://nobody@localhost/none").task(name="t")(lambda: None).job()
watched = ("rich", "pgqueue.cli", "pgqueue.contrib", "sqlalchemy")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in watched or m.startswith(watched))
print(",".join(loaded))
"""


def test_importing_pgqueue_and_building_a_job_loads_no_cli_no_rich_and_no_integration() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
