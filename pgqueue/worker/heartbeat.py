"""A worker's heartbeat: the lease that keeps its running jobs its own.

Owns: one thread with its own connection that refreshes the worker's row every interval, from the
worker's start to its stop (a service, runtime/service.py). It runs beside the event loop, so a
handler that hogs the loop (or a slow claim) cannot make a live worker look dead. If the row was
removed because the worker was presumed dead, the next beat puts it back under the same id, logs
that its jobs were rescued and publishes `WorkerRevived` (events.py). Connection faults are
retried with backoff and logged once per outage; the thread never raises.

With `session` (a direct connection, not PgBouncer's transaction pooling), the connection also
holds the worker's session lock (worker_session_hold in sql/queries/workers.sql) and its beats
record when it took it: once the process dies, PostgreSQL ends the session, the lock is free, and
rescuers take the worker for dead within seconds. Between beats the thread watches the
connection, so a session the server ends while the worker lives is replaced, and the lock taken
again, at once: rescuers wait a couple of seconds of a free lock before they act
(pgqueue/worker/rescuer.py).
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
from dataclasses import replace
from datetime import datetime, timedelta
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
        self.session = session  # hold the worker's session lock: on a direct connection only
        self.session_at: datetime | None = None  # when this connection took it
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
        delay = 0.0  # the first beat at once: it takes the session lock
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
        """Wait up to `timeout` seconds; True once the worker stops. While the connection
        holds the session lock, a session the server ends raises here at once, so the next
        beat, on a new connection, takes the lock again without waiting for the interval."""
        conn = self._conn
        if conn is None or not self.session:
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
        beat = BeatParams(self.identity, self.worker_id, stats, self.session_at)
        if self.session and self.session_at is None:
            with self._conn.transaction():  # the lock and the beat that records it, together
                session_at = self.store.hold_session(self._conn, self.worker_id)
                revived = self.store.heartbeat(self._conn, replace(beat, session_at=session_at))
            self.session_at = session_at
        else:
            revived = self.store.heartbeat(self._conn, beat)
        self.beats += 1
        if revived:
            log.error(
                "worker %s was presumed dead (missed heartbeats past its lease, or its "
                "session ended) and its running jobs were rescued; their outcomes from here "
                "will be refused",
                self.worker_id,
            )
            if self.events is not None:
                self.events.publish_threadsafe(WorkerRevived())

    def _close(self) -> None:
        self.session_at = None  # the lock goes with the connection
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
