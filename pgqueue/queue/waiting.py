"""The waiters of one queue: one listening connection that every wait of the process shares.

Owns: a `Waiters` hub per Queue or AsyncQueue, started by its first wait and closed with the
queue; its connection, which LISTENs on the schema's done channel and runs every statement
the waits need; that session's rows in result_waiters (sql/migrations/0027_result_waiters.sql);
and the meaning of the done channel's payload, parsed here and nowhere else (`parse`). The
sync Queue runs its hub on a thread of its own (`BackgroundWaiters`), so both twins wait
through the same code.

Invariants:
- A job is registered before its state is read, so a finish that commits after the read
  notifies this session.
- A newly registered job is read once more shortly after (`CONFIRM_AFTER`): a finish whose
  notice went out before the registration committed, and which committed after the first
  read (the race migration 0027 describes), is found then, not a poll later.
- Every waited job is read again each `poll_interval`, notices or not: a notice lost (a
  broken connection, a pooler that cannot LISTEN) delays a result by at most that, never
  loses it. With `listen=False` the hub only polls, and registers
  nothing.
- A job's row goes when no wait of this process waits for it any longer: with the read that
  finds it finished, or at the hub's next step after its last wait timed out or was
  cancelled. Closing the queue deletes the session's rows; the rows of a session that died
  are swept by the next hub that connects.
- A wait never changes its job: a timeout or a cancelled wait leaves the job running.

Fails: a first connection that cannot be made, or a statement the database refuses (schema
not migrated, a role without the grant), fails the waits in progress with pgqueue's
DatabaseError; a connection lost later is reopened with backoff while the waits go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import psycopg
from pydantic import field_validator

from pgqueue import dsn as dsn_rule
from pgqueue.errors import ConfigurationError, DatabaseError, PgQueueError, translate
from pgqueue.models import LONGEST_INTERVAL, QueueSettings, Settings
from pgqueue.runtime.link import connect
from pgqueue.store.plan import AsyncConn
from pgqueue.store.waits import JobEnd, WaitsStore

log = logging.getLogger("pgqueue.wait")
P = ParamSpec("P")
T = TypeVar("T")
READ_CHUNK = 5000  # jobs read per statement when a poll covers many
# When a newly registered job is read again: a finish that raced its registration has
# committed by then (its notice went out before the registration, its commit after the read).
CONFIRM_AFTER = (0.05, 0.25, 1.0, 5.0)
_BACKOFF_MAX = 5.0


class WaitSettings(Settings):
    """How a queue's waits hear that a job finished: `listen` on the done channel (turn it
    off behind PgBouncer in transaction mode, where LISTEN does not work), and read every
    waited job again each `poll_interval` (seconds or a timedelta) whatever was heard."""

    poll_interval: timedelta = timedelta(seconds=1)
    listen: bool = True

    if TYPE_CHECKING:  # seconds too, as pydantic accepts them at run time

        def __init__(
            self, *, poll_interval: timedelta | float = ..., listen: bool = ...
        ) -> None: ...

    @field_validator("poll_interval")
    @classmethod
    def _poll_in_range(cls, value: timedelta) -> timedelta:
        if not timedelta(milliseconds=10) <= value <= LONGEST_INTERVAL:
            raise ValueError(f"poll_interval must be from 0.01 seconds to {LONGEST_INTERVAL}")
        return value


# Two threads' first waits on one sync Queue must start one hub, not two.
STARTING = threading.Lock()


def new_hub(dsn: str | None, queue: QueueSettings, settings: WaitSettings, twin: str) -> Waiters:
    """A hub for a queue of these settings; ConfigurationError when it could not wait."""
    if not queue.keep_history:
        raise ConfigurationError(
            f"this {twin} has keep_history=False: a finished job's result is read from its "
            "history, which it does not keep, so there is nothing to wait for"
        )
    if dsn is None:
        raise ConfigurationError(dsn_rule.missing(twin))
    return Waiters(dsn, queue.schema_name, settings, prepare=queue.prepare)


def parse(payload: str) -> int | None:
    """The job id a notice on the done channel names; None for a payload pgqueue never sends
    (a stray NOTIFY from another program must not stop the listener)."""
    return int(payload) if payload.isdigit() else None


class Waiters:
    """The hub: `end(job_id)` returns once the job is no longer live, with its record."""

    def __init__(self, dsn: str, schema: str, settings: WaitSettings, *, prepare: bool) -> None:
        self.dsn = dsn
        self.schema = schema
        self.settings = settings
        self.prepare = prepare
        self.store = WaitsStore(schema)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._waits: dict[int, list[asyncio.Future[JobEnd]]] = {}
        self._register: set[int] = set()  # waited for, not yet registered and read
        self._unregister: set[int] = set()  # registered, no longer waited for
        self._heard: set[int] = set()  # notified, not yet read
        self._confirm: list[tuple[float, frozenset[int]]] = []  # (when, jobs) to read again
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connected = False

    async def end(self, job_id: int) -> JobEnd:
        """Wait (without limit: the caller bounds it) until job `job_id` is no longer live."""
        self.loop = asyncio.get_running_loop()
        future: asyncio.Future[JobEnd] = self.loop.create_future()
        waiting = self._waits.setdefault(job_id, [])
        if not waiting:
            self._register.add(job_id)
            self._unregister.discard(job_id)
        waiting.append(future)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="pgqueue-wait")
        self._work.set()
        try:
            return await future
        finally:
            self._drop(job_id, future)

    def _drop(self, job_id: int, future: asyncio.Future[JobEnd]) -> None:
        waiting = self._waits.get(job_id)
        if waiting is None or future not in waiting:
            return  # resolved: its row went with the read that found it finished
        waiting.remove(future)
        if not waiting:
            del self._waits[job_id]
            if job_id in self._register:
                self._register.discard(job_id)
            else:
                self._unregister.add(job_id)
                self._work.set()

    async def close(self) -> None:
        """Stop the hub: its waits in progress fail, its rows are deleted, its connection
        closed. A later wait starts it again."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._fail(PgQueueError("the queue was closed while waiting for this job"))

    async def _run(self) -> None:
        delay = 0.05
        while True:
            try:
                conn = await connect(self.dsn, prepare=self.prepare, name="pgqueue:wait")
            except DatabaseError as exc:
                if not self._connected:
                    self._fail(exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)
                continue
            try:
                self._connected, delay = True, 0.05
                await self._serve(conn)
                return
            except psycopg.Error as exc:
                if not (conn.closed or conn.broken):
                    self._fail(_translated(exc, self.schema))
                    return
                log.warning("the waiters' connection was lost, reconnecting: %s", exc)
            finally:
                await _close(conn, self.store)

    async def _serve(self, conn: AsyncConn) -> None:
        """Listen, register and read on `conn` until cancelled."""
        if self.settings.listen:
            await self.store.listen(conn)
            await self.store.sweep(conn)
        # A new session: every wait registers again, and every waited job is read.
        self._register = set(self._waits)
        self._unregister.clear()
        self._confirm.clear()
        interval = self.settings.poll_interval.total_seconds()
        next_poll = time.monotonic() + interval
        while True:
            await self._step(conn, poll=time.monotonic() >= next_poll)
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + interval
            wake = min([next_poll, *(at for at, _ in self._confirm)])
            timeout = max(wake - time.monotonic(), 0.0) if self._waits else None
            await self._idle(conn, timeout)

    async def _step(self, conn: AsyncConn, *, poll: bool) -> None:
        """One round: end the waits no one holds, register the new ones, read what may have
        finished (everything waited for, when `poll`), and settle the waits of finished jobs."""
        self._work.clear()
        if self._unregister:
            gone = sorted(self._unregister)
            self._unregister.difference_update(gone)
            await self.store.unregister(conn, gone)
        new, self._register = self._register, set()
        if new and self.settings.listen:
            await self.store.register(conn, sorted(new))
            now = time.monotonic()
            self._confirm.extend((now + delay, frozenset(new)) for delay in CONFIRM_AFTER)
        read = set(self._waits) if poll else (new | self._heard | self._due()) & set(self._waits)
        self._heard.clear()
        ordered = sorted(read)
        for start in range(0, len(ordered), READ_CHUNK):
            ends = await self.store.outcomes(conn, ordered[start : start + READ_CHUNK])
            # Settled before the rows go: the waits resume while the delete commits.
            for end in ends:
                for future in self._waits.pop(end.id, []):
                    if not future.done():
                        future.set_result(end)
            if ends and self.settings.listen:
                await self.store.unregister(conn, [end.id for end in ends])

    def _due(self) -> set[int]:
        """The registered jobs whose confirming read is due; they leave the list."""
        now = time.monotonic()
        due = [ids for at, ids in self._confirm if at <= now]
        if not due:
            return set()
        self._confirm = [(at, ids) for at, ids in self._confirm if at > now]
        return set().union(*due)

    async def _idle(self, conn: AsyncConn, timeout: float | None) -> None:
        """Return on new work, a notice for a waited job, or after `timeout` seconds."""
        if self._work.is_set():
            return
        work = asyncio.ensure_future(self._work.wait())
        heard = asyncio.ensure_future(
            self._hear(conn, timeout) if self.settings.listen else _sleep(timeout)
        )
        try:
            await asyncio.wait({work, heard}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelled too (the queue closing): the listen must release the connection
            for task in (work, heard):
                task.cancel()
            await asyncio.gather(work, heard, return_exceptions=True)
        if not heard.cancelled():
            heard.result()  # a broken connection raises here

    async def _hear(self, conn: AsyncConn, timeout: float | None) -> None:
        async for note in conn.notifies(timeout=timeout):
            job_id = parse(note.payload)
            if job_id is not None and job_id in self._waits:
                self._heard.add(job_id)
                self._work.set()

    def _fail(self, error: Exception) -> None:
        for waiting in self._waits.values():
            for future in waiting:
                if not future.done():
                    future.set_exception(error)
        self._register.clear()


async def _sleep(seconds: float | None) -> None:
    """Sleep `seconds`; None: until cancelled."""
    await (
        asyncio.sleep(seconds)
        if seconds is not None
        else asyncio.get_running_loop().create_future()
    )


async def _close(conn: AsyncConn, store: WaitsStore) -> None:
    """Delete this session's rows (closing the session would leave them to a sweep) and
    close it; a broken connection is only closed."""
    if not (conn.closed or conn.broken):
        with contextlib.suppress(psycopg.Error, asyncio.CancelledError):
            await asyncio.shield(store.unregister(conn, None))
    await conn.close()


def _translated(exc: psycopg.Error, schema: str) -> Exception:
    """The pgqueue error a database error stands for, as the queue's own calls raise it."""
    try:
        translate(exc, schema)
    except PgQueueError as error:
        return error
    return DatabaseError(f"{type(exc).__name__}: {exc}")


class BackgroundWaiters:
    """A hub on a thread of its own, for the sync Queue: its calls block the caller's thread
    while the hub's loop waits."""

    def __init__(self, hub: Waiters) -> None:
        self.hub = hub
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pgqueue-wait", daemon=True
        )
        self._thread.start()

    def call(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *args: Any,
        **kwargs: Any,
    ) -> T:
        """Run `fn(hub, *args, **kwargs)` on the hub's loop; its result or its error. An
        interrupt (Ctrl-C) cancels it there before it is raised here."""
        future = asyncio.run_coroutine_threadsafe(fn(self.hub, *args, **kwargs), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def iterate(self, items: AsyncIterator[T]) -> Iterator[T]:
        """The async iterator `items`, driven on the hub's loop, as a sync iterator."""

        async def following(_hub: Waiters) -> tuple[bool, T | None]:
            try:
                return True, await items.__anext__()
            except StopAsyncIteration:
                return False, None

        async def closing(_hub: Waiters) -> None:
            await items.aclose()  # type: ignore[attr-defined]

        try:
            while True:
                more, item = self.call(following)
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            if not self._loop.is_closed():  # else the queue's close() ended it already
                self.call(closing)

    def close(self) -> None:
        """Close the hub, then stop its thread."""

        async def closing(hub: Waiters) -> None:
            await hub.close()

        self.call(closing)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
