"""`pgqueue relay`: publishes the messages staged in the outbox to their brokers.

Owns: one connection, on which it becomes the schema's publishing relay (a session advisory
lock; a second relay waits as a standby and takes over when the first one's session ends),
listens for committed stagings, reads staged messages in id order from its hint, hands them
to the sinks, and deletes each one only after its broker confirmed it. Invariants:
- nothing is deleted before its broker confirmed it, so a crash re-publishes at most what
  was in flight, with the same message ids (delivery is at least once);
- messages with the same key go through one lane, in id order, one sink call after another,
  so they are published in the order their transactions committed; different keys spread
  over `publishers` lanes that publish at once;
- a message a lane could not publish holds back the rest of that lane's batch, and the hint
  goes back to it, so nothing of a key overtakes it.
The hint keeps reads off the entries of deleted messages that VACUUM may not have removed
(a long transaction holds them): reads start after the last message handled, and behind it
take only the messages of the transactions the previous read saw open, so each read returns
what a read from the first id would, and a transaction whose ids straddle the hint is
published whole, in order, once it commits (outbox_read in sql/queries/outbox.sql says why).
Messages staged again by `retry` are behind the hint and of transactions long over: their
notice moves the hint back, and the hint goes back to the start every
`hint_reset_interval` (jittered) for any notice lost.
A broker that is down is retried with backoff; the database going away ends the lead, and
the relay reconnects and competes for it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.dsn import redact
from pgqueue.errors import ConfigurationError, DatabaseError
from pgqueue.models import SCHEMA_NAME, RelayState, check_identifier
from pgqueue.queries import outbox_channel
from pgqueue.relay.sinks import Outgoing, Sink
from pgqueue.runtime.link import connect
from pgqueue.store import relays as relays_store
from pgqueue.store.outbox import Open, OutboxStore, Staged
from pgqueue.store.plan import AsyncConn

log = logging.getLogger("pgqueue.relay")


@dataclass
class RelayStats:
    """What a relay has done since it started."""

    published: int = 0
    refused: int = 0
    failed_attempts: int = 0
    rounds: int = 0
    leading: bool = False
    last_error: str | None = None


@dataclass
class _Round:
    confirmed: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    failed: list[int] = field(default_factory=list)
    error: str | None = None


class Relay:
    """Publishes staged messages through `sinks` (name -> Sink; a message's destination
    "name:target" picks its sink). Run it with `pgqueue relay MODULE:ATTR`, or
    `await relay.run()` until `relay.stop()`."""

    def __init__(
        self,
        sinks: Mapping[str, Sink],
        *,
        dsn: str | None = None,
        schema: str = "pgqueue",
        batch_size: int = 500,
        publishers: int = 8,
        poll_interval: timedelta = timedelta(seconds=1),
        hint_reset_interval: timedelta = timedelta(seconds=10),
        retry_base: timedelta = timedelta(milliseconds=200),
        retry_cap: timedelta = timedelta(seconds=30),
        standby_interval: timedelta = timedelta(seconds=2),
        report_interval: timedelta = timedelta(seconds=5),
    ) -> None:
        if not sinks:
            raise ConfigurationError("a Relay needs at least one sink: Relay({'name': sink})")
        for name in sinks:
            if not isinstance(name, str) or ":" in name or not name:
                raise ConfigurationError(f"sink names are words without ':', got {name!r}")
        if not 1 <= batch_size <= 10_000 or not 1 <= publishers <= 256:
            raise ConfigurationError("batch_size is 1 to 10000 and publishers 1 to 256")
        self.sinks = dict(sinks)
        self.dsn = dsn
        self.schema = check_identifier("schema", schema, SCHEMA_NAME)
        self.batch_size = batch_size
        self.publishers = publishers
        self.poll_interval = poll_interval.total_seconds()
        self.hint_reset_interval = hint_reset_interval.total_seconds()
        self.retry_base = retry_base.total_seconds()
        self.retry_cap = retry_cap.total_seconds()
        self.standby_interval = standby_interval.total_seconds()
        self.report_interval = report_interval.total_seconds()
        self.stats = RelayStats()
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self._started_at = datetime.now(timezone.utc)
        self._reported = (0.0, 0)  # when, and what had been published then
        self._store = OutboxStore(self.schema)
        self._stopping: asyncio.Event | None = None

    def stop(self) -> None:
        """Finish the round in hand (what was published is deleted), then return from
        run(). Safe to call from a signal handler on the relay's loop."""
        if self._stopping is not None:
            self._stopping.set()

    async def run(self, dsn: str | None = None) -> None:
        """Publish until stop(): as the leading relay, or as a standby until it can lead."""
        dsn = dsn or self.dsn
        if not dsn:
            raise ConfigurationError("give the Relay a dsn, or pass one to run()")
        self._stopping = asyncio.Event()
        self._store = OutboxStore(check_identifier("schema", self.schema, SCHEMA_NAME))
        try:
            for name, sink in self.sinks.items():
                await self._open(name, sink)
            while not self._stopping.is_set():
                try:
                    await self._session(dsn)
                except (psycopg.OperationalError, OSError, DatabaseError) as exc:
                    self.stats.leading = False
                    self.stats.last_error = str(exc)
                    log.warning("relay lost the database (%s); reconnecting", exc)
                    await self._pause(self.standby_interval)
        finally:
            for sink in self.sinks.values():
                with contextlib.suppress(Exception):
                    await sink.close()

    async def _open(self, name: str, sink: Sink) -> None:
        """Open a sink, trying again with backoff while its broker is away."""
        assert self._stopping is not None
        failures = 0
        while not self._stopping.is_set():
            try:
                await sink.open()
                return
            except Exception as exc:
                failures += 1
                delay = min(self.retry_cap, self.retry_base * 2 ** min(failures - 1, 20))
                self.stats.last_error = f"{name}: {exc}"
                log.warning("sink %s cannot open (%s); again in %.1f s", name, exc, delay)
                await self._pause(delay)

    async def _session(self, dsn: str) -> None:
        # The pid in the session's name tells an operator which relay process leads.
        conn = await connect(dsn, name=f"pgqueue relay {os.getpid()}")
        try:
            # A standby keeps its session and asks again, until the leader's session ends.
            while not await self._store.lead(conn, f"{self.schema} relay"):
                log.debug("another relay leads %s; standing by", redact(dsn))
                await self._report(conn)
                await self._pause(self.standby_interval)
                if self._stopping is not None and self._stopping.is_set():
                    return
            channel = sql.Identifier(outbox_channel(self.schema))
            await conn.execute(sql.SQL("LISTEN {}").format(channel))
            self.stats.leading = True
            log.info("relay leads schema %s", self.schema)
            await self._lead(conn)
        finally:
            self.stats.leading = False
            with contextlib.suppress(Exception):
                if self._stopping is not None and self._stopping.is_set():
                    await relays_store.forget(conn, self.schema, self.name)
                await conn.close()

    async def _lead(self, conn: AsyncConn) -> None:
        assert self._stopping is not None
        hint, failures = 0, 0
        seen = Open()  # the transactions the last read saw open; none before the first
        reset_at = self._next_reset()
        while not self._stopping.is_set():
            await self._report(conn)
            if time.monotonic() >= reset_at:
                hint, reset_at = 0, self._next_reset()
            read = await self._store.read(conn, hint, seen, self.batch_size)
            batch, seen = read.messages, read.open
            if not batch:
                hint = await self._wait(conn, hint, self.poll_interval)
                continue
            done = await self._publish(batch)
            self.stats.rounds += 1
            if done.confirmed:
                await self._store.delete(conn, done.confirmed)
                self.stats.published += len(done.confirmed)
            if done.refused:
                await self._store.kill(conn, done.refused)
                self.stats.refused += len(done.refused)
            if done.failed:
                await self._store.note_failure(conn, done.failed, done.error or "failed")
                self.stats.failed_attempts += 1
                self.stats.last_error = done.error
                failures += 1
                hint = min(done.failed) - 1
                delay = min(self.retry_cap, self.retry_base * 2 ** min(failures - 1, 20))
                log.warning("publish failed (%s); again in %.1f s", done.error, delay)
                hint = await self._wait(conn, hint, delay * random.uniform(0.5, 1.0))
                continue
            failures = 0
            hint = await self._lowered(conn, batch[-1].id)

    async def _publish(self, batch: Sequence[Staged]) -> _Round:
        """Every lane of the batch at once; each lane's messages in order."""
        lanes: dict[int, list[Staged]] = {}
        for message in batch:
            lane = hash(message.key) if message.key is not None else message.id
            lanes.setdefault(lane % self.publishers, []).append(message)
        done = _Round()
        for lane_round in await asyncio.gather(*(self._lane(ms) for ms in lanes.values())):
            done.confirmed += lane_round.confirmed
            done.refused |= lane_round.refused
            done.failed += lane_round.failed
            done.error = done.error or lane_round.error
        return done

    async def _lane(self, messages: list[Staged]) -> _Round:
        """One lane: runs of the same sink, one call each, in order; the first that fails
        holds back the rest."""
        done = _Round()
        start = 0
        while start < len(messages):
            end = start
            while end < len(messages) and messages[end].sink == messages[start].sink:
                end += 1
            run = messages[start:end]
            sink = self.sinks.get(run[0].sink)
            if sink is None:
                reason = f"no sink named {run[0].sink!r} in this relay ({', '.join(self.sinks)})"
                done.refused |= {m.id: reason for m in run}
            else:
                try:
                    outcomes = await sink.publish([_outgoing(m) for m in run])
                except Exception as exc:
                    done.failed = [m.id for m in messages[start:]]
                    done.error = f"{run[0].sink}: {type(exc).__name__}: {exc}"
                    return done
                if len(outcomes) != len(run):
                    done.failed = [m.id for m in messages[start:]]
                    done.error = f"{run[0].sink}: answered {len(outcomes)} of {len(run)}"
                    return done
                for m, outcome in zip(run, outcomes, strict=True):
                    if outcome is None:
                        done.confirmed.append(m.id)
                    else:
                        done.refused[m.id] = outcome
            start = end
        return done

    async def _wait(self, conn: AsyncConn, hint: int, seconds: float) -> int:
        """Wait up to `seconds` for a staging to commit; the hint, moved back to before any
        committed staging that began behind it. A stop() is heard at the end of the wait."""
        async for notice in _notices(conn, seconds, stop_after=1):
            hint = _behind(hint, notice)
        return await self._lowered(conn, hint)

    async def _lowered(self, conn: AsyncConn, hint: int) -> int:
        """The hint, moved back for notices that arrived meanwhile."""
        async for notice in _notices(conn, 0.0):
            hint = _behind(hint, notice)
        return hint

    async def _report(self, conn: AsyncConn) -> None:
        """Write this relay's row for `pgqueue status`, every `report_interval`. A failure is
        logged: reporting never stops the publishing."""
        now = time.monotonic()
        since, published = self._reported
        if since and now - since < self.report_interval:
            return
        rate = (self.stats.published - published) / (now - since) if since else 0.0
        state = RelayState(
            name=self.name,
            hostname=self.name.rpartition(":")[0],
            pid=os.getpid(),
            leading=self.stats.leading,
            started_at=self._started_at,
            published=self.stats.published,
            refused=self.stats.refused,
            failed=self.stats.failed_attempts,
            per_second=round(rate, 1),
            last_error=self.stats.last_error,
        )
        self._reported = (now, self.stats.published)
        try:
            await relays_store.report(conn, self.schema, state)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                raise  # the session is gone: reconnect
            log.warning("relay could not report itself (%s); publishing goes on", exc)

    async def _pause(self, seconds: float) -> None:
        assert self._stopping is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _next_reset(self) -> float:
        return time.monotonic() + self.hint_reset_interval * random.uniform(0.5, 1.5)


async def _notices(conn: AsyncConn, seconds: float, stop_after: int | None = None) -> Any:
    """The payloads of notices on `conn` within `seconds` (those already received first)."""
    async for notice in conn.notifies(timeout=seconds, stop_after=stop_after):
        yield notice.payload


def _behind(hint: int, payload: str) -> int:
    """The hint, moved back to just before a committed staging's first id if that is behind
    it; a payload that is not an id leaves it as it is."""
    try:
        first = int(payload)
    except ValueError:
        return hint
    return min(hint, first - 1)


def _outgoing(m: Staged) -> Outgoing:
    return Outgoing(
        id=m.id,
        target=m.target,
        key=m.key,
        message=m.message,
        headers=m.headers,
        message_id=m.message_id,
    )
