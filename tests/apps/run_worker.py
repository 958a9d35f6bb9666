"""Run a Worker over tests.apps.tasks:queue as a real process with any WorkerSettings.

python -m tests.apps.run_worker DSN SCHEMA '{"concurrency": 2, "lease_timeout": 1}'
"""

from __future__ import annotations

import json
import logging
import sys

from pgqueue import Worker
from tests.apps import tasks as apps


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    dsn, schema, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    Worker(apps.queue, dsn=dsn, schema=schema, **settings).run()


if __name__ == "__main__":
    main()
