"""One of several processes racing scheduler passes over the same injected instants.

python -m tests.apps.periodic_race DSN SCHEMA WORKER_ID FOLDER FIRST_EPOCH STEPS

Writes FOLDER/ready-WORKER_ID once connected, waits for FOLDER/go, then runs one pass at
each instant FIRST_EPOCH + k seconds (k < STEPS), as fast as it can, and exits 0.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from pgqueue import Queue
from pgqueue.worker.scheduler import Scheduler

queue = Queue()


@queue.periodic(every=timedelta(seconds=1), name="each_second")
@queue.periodic(cron="*/2 * * * *", name="every_two_minutes", missed="run_once")
@queue.task(name="race_tick")
def race_tick() -> None:
    pass


async def main(dsn: str, schema: str, worker_id: int, folder: Path, first: int, steps: int) -> None:
    scheduler = Scheduler(queue.periodics, schema, worker_id)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        (folder / f"ready-{worker_id}").touch()
        deadline = time.monotonic() + 60
        while not (folder / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit("never told to go")
            time.sleep(0.005)
        start = datetime.fromtimestamp(first, timezone.utc)
        for k in range(steps):
            await scheduler.run_pass(conn, now=start + timedelta(seconds=k))


if __name__ == "__main__":
    dsn, schema, worker, folder, first, steps = sys.argv[1:7]
    asyncio.run(main(dsn, schema, int(worker), Path(folder), int(first), int(steps)))
