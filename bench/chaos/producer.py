"""One chaos producer process: paced transactions that each insert an order and enqueue its job.

    python -m bench.chaos.producer '{"dsn": ..., "schema": ..., "mode": ..., "index": 1,
                                     "count": 5000, "rate": 400, "rollback": 0.5,
                                     "work_ms": 5, "run_dir": ...}'

Each transaction inserts one `bench_orders` row and enqueues, on the same connection, the job
that references it; then commits, or rolls back with probability `rollback`. Each attempt
appends one line to `producer-<index>.txt` in the run folder: `job_id order_id outcome`, where
outcome is C (committed), R (rolled back), E (failed before COMMIT was sent: nothing was
committed) or ? (COMMIT was sent but its answer was lost: the bench resolves it by whether the
order exists). Ids not known are `-`. A lost connection is reopened with backoff, so the
producer rides out server restarts; it writes `ready-<index>` once connected and starts when
the bench creates `go`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.chaos.app import make_queue

RECONNECT_FOR_SECONDS = 120.0
GO_TIMEOUT_SECONDS = 120.0


class Producer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.dsn: str = config["dsn"]
        self.index: int = config["index"]
        self.queue, self.task = make_queue(config["mode"], config["schema"])
        self.insert_order = sql.SQL(
            "INSERT INTO {}.bench_orders (producer) VALUES (%s) RETURNING id"
        ).format(sql.Identifier(config["schema"]))
        self.run_dir = Path(config["run_dir"])
        log = self.run_dir / f"producer-{self.index}.txt"
        self.log = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.rng = random.Random(f"{config['schema']}-{self.index}")
        self.conn: psycopg.Connection[Any] | None = None

    def run(self) -> None:
        self.conn = self._connect()
        (self.run_dir / f"ready-{self.index}").touch()
        self._wait_for_go()
        count, rate, rollback = self.config["count"], self.config["rate"], self.config["rollback"]
        started = time.monotonic()
        for n in range(count):
            delay = started + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._one(self.rng.random() < rollback)
        if self.conn is not None:
            self.conn.close()

    def _one(self, roll_back: bool) -> None:
        if self.conn is None:
            self.conn = self._connect()
        conn = self.conn
        order_id = job_id = None
        try:
            row = conn.execute(self.insert_order, [self.index]).fetchone()
            assert row is not None
            order_id = row[0]
            job_id = self.queue.enqueue(self.task.job(order_id, self.config["work_ms"]), conn=conn)
        except psycopg.Error:
            self._abandon()
            self._write(job_id, order_id, "E")
            return
        if roll_back:
            self._abandon()
            self._write(job_id, order_id, "R")
            return
        try:
            conn.commit()
        except psycopg.Error:
            self._write(job_id, order_id, "?")
            self._abandon()
            return
        self._write(job_id, order_id, "C")

    def _abandon(self) -> None:
        """Roll back the open transaction; drop the connection if it is broken."""
        assert self.conn is not None
        try:
            self.conn.rollback()
        except psycopg.Error:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
            self.conn = None
            return
        if self.conn.broken or self.conn.closed:
            self.conn = None

    def _connect(self) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + RECONNECT_FOR_SECONDS
        delay = 0.02
        while True:
            try:
                return psycopg.connect(self.dsn, application_name=f"chaos:producer-{self.index}")
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _wait_for_go(self) -> None:
        deadline = time.monotonic() + GO_TIMEOUT_SECONDS
        while not (self.run_dir / "go").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"producer {self.index}: no go after {GO_TIMEOUT_SECONDS} s")
            time.sleep(0.01)

    def _write(self, job_id: int | None, order_id: int | None, outcome: str) -> None:
        fields = [str(v) if v is not None else "-" for v in (job_id, order_id)]
        os.write(self.log, f"{fields[0]} {fields[1]} {outcome}\n".encode())


def main(argv: list[str]) -> None:
    (config,) = argv
    Producer(json.loads(config)).run()


if __name__ == "__main__":
    main(sys.argv[1:])
