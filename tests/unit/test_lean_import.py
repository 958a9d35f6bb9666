"""An application that only enqueues loads neither the command line nor its dependencies."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import sys
import pgqueue
from pgqueue import Queue, AsyncQueue, Worker
Queue("postgresql://nobody@localhost/none").task(name="t")(lambda: None).job()
loaded = sorted(m for m in sys.modules if m == "rich" or m.startswith(("rich.", "pgqueue.cli")))
print(",".join(loaded))
"""


def test_importing_pgqueue_and_building_a_job_loads_no_cli_and_no_rich() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
