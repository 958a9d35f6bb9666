"""One of several processes racing scheduler passes over the same injected instants.

python -m tests.apps.periodic_race DSN SCHEMA WORKER_ID FOLDER FIRST_EPOCH STEPS RACERS

Writes FOLDER/ready-WORKER_ID once connected, waits for FOLDER/go, then runs one pass at
each instant FIRST_EPOCH + k seconds (k < STEPS), as fast as it can, and exits 0. Every
few instants the racers wait for each other, so a racer that got the processor first cannot
run the whole schedule alone and leave nothing to race for.
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


LAP = 10


def wait_for(paths: list[Path], what: str) -> None:
    deadline = time.monotonic() + 60
    while not all(path.exists() for path in paths):
        if time.monotonic() > deadline:
            raise SystemExit(f"never saw {what}")
        time.sleep(0.001)


async def main(
    dsn: str, schema: str, worker_id: int, folder: Path, first: int, steps: int, racers: int
) -> None:
    scheduler = Scheduler(queue.periodics, schema, worker_id)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        (folder / f"ready-{worker_id}").touch()
        wait_for([folder / "go"], "the go")
        start = datetime.fromtimestamp(first, timezone.utc)
        for k in range(steps):
            if k and k % LAP == 0:
                (folder / f"lap-{k}-{worker_id}").touch()
                lap = [folder / f"lap-{k}-{n}" for n in range(1, racers + 1)]
                wait_for(lap, f"every racer at instant {k}")
            await scheduler.run_pass(conn, now=start + timedelta(seconds=k))


if __name__ == "__main__":
    dsn, schema, worker, folder, first, steps, racers = sys.argv[1:8]
    asyncio.run(main(dsn, schema, int(worker), Path(folder), int(first), int(steps), int(racers)))
