"""One chaos worker process: a pgqueue.Worker over bench/chaos/app.py's queue for one mode.

    python -m bench.chaos.worker DSN SCHEMA MODE RUN_DIR '{"concurrency": 10, ...}'

The JSON object holds WorkerSettings fields. Runs are recorded under RUN_DIR (see
bench/chaos/app.py). Stops like any worker: SIGTERM, then a clean exit with code 0.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from bench.chaos.app import RUN_DIR_ENV, make_queue
from pgqueue import Worker


def main(argv: list[str]) -> None:
    dsn, schema, mode, run_dir, settings = argv
    os.environ[RUN_DIR_ENV] = run_dir
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
    )
    queue, _ = make_queue(mode, schema)
    Worker(queue, dsn=dsn, **json.loads(settings)).run()


if __name__ == "__main__":
    main(sys.argv[1:])
