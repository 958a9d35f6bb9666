"""A worker's heartbeat: the lease that keeps its running jobs its own.

Owns: one thread with its own connection that refreshes the worker's row every interval. It
runs beside the event loop, so a handler that hogs the loop (or a slow claim) cannot make a
live worker look dead. If the row was removed because the worker was presumed dead, the next
beat puts it back under the same id and logs that its jobs were rescued. Connection faults are
retried with backoff and logged once per outage; the thread never raises.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import timedelta
from typing import Any

import psycopg

from pgqueue.queries import query

log = logging.getLogger("pgqueue.worker")


class Heartbeat(threading.Thread):
    def __init__(self, dsn: str, schema: str, params: dict[str, Any], interval: timedelta) -> None:
        super().__init__(name="pgqueue-heartbeat", daemon=True)
        self.dsn = dsn
        self.schema = schema
        self.params = params
        self.interval = interval.total_seconds()
        self.beats = 0
        self._stop_requested = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None

    def run(self) -> None:
        outage = False
        while not self._stop_requested.wait(self.interval):
            try:
                self._beat()
            except psycopg.Error as exc:
                if not outage:
                    log.error("heartbeat failed, retrying every beat: %s", exc)
                outage = True
                self._close()
                continue
            if outage:
                log.warning("heartbeat is back")
                outage = False
        self._close()

    def stop(self) -> None:
        self._stop_requested.set()
        self.join(timeout=max(self.interval, 1.0) + 5)

    def _beat(self) -> None:
        if self._conn is None:
            self._conn = psycopg.connect(
                self.dsn, autocommit=True, application_name="pgqueue:heartbeat"
            )
        row = self._conn.execute(query("worker_heartbeat", self.schema), self.params).fetchone()
        self.beats += 1
        if row and row[0]:
            log.error(
                "worker %s was presumed dead (missed heartbeats past its lease) and its running "
                "jobs were rescued; their outcomes from here will be refused",
                self.params["worker_id"],
            )

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
