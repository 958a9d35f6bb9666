"""A worker's heartbeat: the lease that keeps its running jobs its own.

Owns: one thread with its own connection that refreshes the worker's row every interval, from the
worker's start to its stop (a service, runtime/service.py). It runs beside the event loop, so a
handler that hogs the loop (or a slow claim) cannot make a live worker look dead. If the row was
removed because the worker was presumed dead, the next beat puts it back under the same id, logs
that its jobs were rescued and publishes `WorkerRevived` (events.py). Connection faults are
retried with backoff and logged once per outage; the thread never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg

from pgqueue.codec import encode_json
from pgqueue.runtime.service import Health
from pgqueue.store.plan import SyncConn
from pgqueue.store.workers import WorkersStore
from pgqueue.worker.events import Bus, WorkerRevived

log = logging.getLogger("pgqueue.worker")


class Heartbeat:
    name = "heartbeat"

    def __init__(
        self,
        dsn: str,
        schema: str,
        params: dict[str, Any],
        interval: timedelta,
        *,
        prepare: bool = True,
        events: Bus | None = None,
        report: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.report = report  # the worker's tally, called from the heartbeat's thread
        self.dsn = dsn
        self.prepare = prepare  # off behind PgBouncer's transaction pooling (poll_only)
        self.store = WorkersStore(schema)
        self.params = params
        self.events = events  # published to from the heartbeat's thread
        self.interval = interval.total_seconds()
        self.beats = 0
        self.outage = False
        self._stop_requested = threading.Event()
        self._conn: SyncConn | None = None
        self._thread = threading.Thread(target=self._run, name="pgqueue-heartbeat", daemon=True)

    async def start(self) -> None:
        self._thread.start()

    async def stop(self, deadline: float) -> None:
        self._stop_requested.set()
        # A beat in flight finishes first; joined off the event loop, which it must not block.
        await asyncio.to_thread(self._thread.join, max(deadline - time.monotonic(), 0.0))

    def health(self) -> Health:
        if self.outage:
            return Health(False, "beats failing: the lease of this worker's jobs may lapse")
        return Health(self._thread.is_alive(), f"{self.beats} beats")

    def _run(self) -> None:
        while not self._stop_requested.wait(self.interval):
            try:
                self._beat()
            except psycopg.Error as exc:
                if not self.outage:
                    log.error("heartbeat failed, retrying every beat: %s", exc)
                self.outage = True
                self._close()
                continue
            if self.outage:
                log.warning("heartbeat is back")
                self.outage = False
        self._close()

    def _beat(self) -> None:
        if self._conn is None:
            self._conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                application_name="pgqueue:heartbeat",
                prepare_threshold=5 if self.prepare else None,
            )
        stats = encode_json(self.report()) if self.report is not None else None
        revived = self.store.heartbeat(self._conn, self.params | {"stats": stats})
        self.beats += 1
        if revived:
            log.error(
                "worker %s was presumed dead (missed heartbeats past its lease) and its running "
                "jobs were rescued; their outcomes from here will be refused",
                self.params["worker_id"],
            )
            if self.events is not None:
                self.events.publish_threadsafe(WorkerRevived())

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
