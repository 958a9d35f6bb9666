"""A worker's heartbeat: the lease that keeps its running jobs its own.

Owns: one thread with its own connection that refreshes the worker's row every interval, from the
worker's start to its stop (a service, runtime/service.py). It runs beside the event loop, so a
handler that hogs the loop (or a slow claim) cannot make a live worker look dead. If the row was
removed because the worker was presumed dead, the next beat puts it back under the same id, logs
that its jobs were rescued and publishes `WorkerRevived` (events.py). Connection faults are
retried with backoff and logged once per outage; the thread never raises.

With `session` (not polling through PgBouncer), each beat records the server session it runs
on, its pid and backend start (worker_heartbeat in sql/queries/workers.sql): once the process
dies, PostgreSQL ends the session, and rescuers that no longer find it take the worker for dead
within seconds. Between beats the thread watches the connection, so a session the server ends
while the worker lives is replaced, and the new one recorded, at once: rescuers wait a couple of
seconds of a missing session before they act (pgqueue/worker/rescuer.py). A connection that
turns out not to be a session of the worker's own (a pooler names a pid of its own) records
none, and the worker is left to its lease; that is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import pq

from pgqueue.codec import encode_json
from pgqueue.runtime.service import Health
from pgqueue.store.plan import SyncConn
from pgqueue.store.workers import BeatParams, WorkerIdentity, WorkersStore
from pgqueue.worker.events import Bus, WorkerRevived

log = logging.getLogger("pgqueue.worker")
_RETRY_FIRST = 0.05  # seconds before the first retry of a failed beat, doubled up to the interval


class Heartbeat:
    name = "heartbeat"

    def __init__(
        self,
        dsn: str,
        schema: str,
        identity: WorkerIdentity,
        worker_id: int,
        interval: timedelta,
        *,
        prepare: bool = True,
        session: bool = False,
        events: Bus | None = None,
        report: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.report = report  # the worker's tally, called from the heartbeat's thread
        self.dsn = dsn
        self.prepare = prepare  # off behind PgBouncer's transaction pooling (poll_only)
        self.session = session  # record the beat's session: on a direct connection only
        self.recorded = False  # whether the last beat recorded its session
        self.store = WorkersStore(schema)
        self.identity = identity
        self.worker_id = worker_id
        self.events = events  # published to from the heartbeat's thread
        self.interval = interval.total_seconds()
        self.beats = 0
        self.outage = False
        self._stop_requested = threading.Event()
        self._conn: SyncConn | None = None
        self._waker: socket.socket | None = None  # stop() writes to it to end a wait at once
        self._waker_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pgqueue-heartbeat", daemon=True)

    async def start(self) -> None:
        self._thread.start()

    async def stop(self, deadline: float) -> None:
        self._stop_requested.set()
        with self._waker_lock:
            if self._waker is not None:
                self._waker.send(b"\0")
        # A beat in flight finishes first; joined off the event loop, which it must not block.
        await asyncio.to_thread(self._thread.join, max(deadline - time.monotonic(), 0.0))

    def health(self) -> Health:
        if self.outage:
            return Health(False, "beats failing: the lease of this worker's jobs may lapse")
        return Health(self._thread.is_alive(), f"{self.beats} beats")

    def _run(self) -> None:
        woken, waker = socket.socketpair()
        with self._waker_lock:
            self._waker = waker
        try:
            self._beat_until_stopped(woken)
        finally:
            with self._waker_lock:
                self._waker = None
            waker.close()
            woken.close()
            self._close()

    def _beat_until_stopped(self, woken: socket.socket) -> None:
        delay = 0.0  # the first beat at once: it records the worker's session
        retry = _RETRY_FIRST
        while True:
            try:
                if self._wait(delay, woken):
                    return
                self._beat()
            except psycopg.Error as exc:
                if not self.outage:
                    log.error("heartbeat failed, retrying with backoff: %s", exc)
                self.outage = True
                self._close()
                delay, retry = retry, min(retry * 2, self.interval)
                continue
            if self.outage:
                log.warning("heartbeat is back")
                self.outage = False
            delay, retry = self.interval, _RETRY_FIRST

    def _wait(self, timeout: float, woken: socket.socket) -> bool:
        """Wait up to `timeout` seconds; True once the worker stops. While the connection's
        session is the one recorded, a session the server ends raises here at once, so the
        next beat, on a new connection, records the new one without waiting for the interval."""
        conn = self._conn
        if conn is None or not self.recorded:
            return self._stop_requested.wait(timeout)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(woken, selectors.EVENT_READ)
            while not self._stop_requested.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if selector.select(left) and not self._stop_requested.is_set():
                    # Read what came (the server's last words, or a notice) off the socket.
                    conn.pgconn.consume_input()
                    if conn.pgconn.status != pq.ConnStatus.OK:
                        raise psycopg.OperationalError("the heartbeat's session was ended")
        return True

    def _beat(self) -> None:
        if self._conn is None:
            self._conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                application_name="pgqueue:heartbeat",
                prepare_threshold=5 if self.prepare else None,
            )
        stats = encode_json(self.report()) if self.report is not None else None
        client_pid = self._conn.info.backend_pid if self.session else None
        beat = self.store.heartbeat(
            self._conn, BeatParams(self.identity, self.worker_id, stats, client_pid)
        )
        if self.session and not beat.recorded and self.beats == 0:
            log.warning(
                "the heartbeat's connection is not a database session of this worker's own "
                "(a pooler such as PgBouncer between them?): a death of this worker is found "
                "after its lease (lease_timeout), not within seconds"
            )
        self.recorded = beat.recorded
        self.beats += 1
        if beat.revived:
            log.error(
                "worker %s was presumed dead (missed heartbeats past its lease, or its "
                "session ended) and its running jobs were rescued; their outcomes from here "
                "will be refused",
                self.worker_id,
            )
            if self.events is not None:
                self.events.publish_threadsafe(WorkerRevived())

    def _close(self) -> None:
        self.recorded = False  # the session goes with the connection
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
