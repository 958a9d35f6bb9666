"""The outbox: messages for other systems staged in the caller's transaction, read and
deleted by the relay once published. Runs sql/queries/outbox.sql."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pgqueue.errors import ConfigurationError, InvalidArgumentsError
from pgqueue.models import DeadMessage, Message, OutboxStats
from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, Plan, execute, fetch, fetch_one, one_as, rows_as


@dataclass(frozen=True)
class Staged:
    """A staged message as the relay reads it; `message_id` is the caller's, else the
    row's id."""

    id: int
    destination: str
    key: str | None
    message: object  # the JSON value, decoded
    headers: dict[str, str] | None
    message_id: str
    attempts: int

    @property
    def sink(self) -> str:
        return self.destination.partition(":")[0]

    @property
    def target(self) -> str:
        return self.destination.partition(":")[2]


@dataclass(frozen=True)
class Open:
    """The transactions open in a read's snapshot: `xids`, and every xid from `later` on.
    Opaque to Python: passed back to the next read as they came."""

    xids: tuple[str, ...] = ()
    later: str | None = None


@dataclass(frozen=True)
class Read:
    """A read's committed staged messages, in id order, and the transactions it saw open."""

    messages: list[Staged]
    open: Open


@dataclass(frozen=True)
class ReadRow:
    """A row of outbox_read: the transactions open in its snapshot (on the first row only),
    and a staged message (none when there was none to read)."""

    open: list[str] | None
    later: str | None
    id: int | None
    destination: str
    key: str | None
    message: object
    headers: dict[str, str] | None
    message_id: str
    attempts: int

    def staged(self) -> Staged:
        assert self.id is not None
        return Staged(
            self.id,
            self.destination,
            self.key,
            self.message,
            self.headers,
            self.message_id,
            self.attempts,
        )


@dataclass(frozen=True)
class MessageId:
    """outbox_insert's row: a staged message's id."""

    id: int


@dataclass(frozen=True)
class Retried:
    """outbox_retry's row: how many dead messages were staged again; the wake-up sent."""

    retried: int
    told: bool | None


@dataclass(frozen=True)
class Stats:
    """outbox_stats's row."""

    staged: int
    oldest_staged: datetime | None
    dead: int


@dataclass(frozen=True)
class Dead:
    """A row of outbox_list_dead."""

    id: int
    destination: str
    key: str | None
    message_id: str | None
    attempts: int
    error: str | None
    dead_at: datetime


@dataclass(frozen=True)
class Lead:
    """outbox_lead's row: whether the session lock was taken."""

    locked: bool


def insert_plan(
    schema: str, messages: Sequence[Message], max_payload_bytes: int | None
) -> Plan[list[int]]:
    """Stage `messages`; their ids in the order given. Raises InvalidArgumentsError, naming
    the message, for one that PostgreSQL could not store or that is over the payload limit;
    nothing is stored then."""
    encoded = encode(messages, max_payload_bytes)
    rows = yield query("outbox_insert", schema), {"messages": encoded}
    return [row.id for row in rows_as(MessageId, rows)]


def encode(messages: Sequence[Message], max_payload_bytes: int | None) -> str:
    """The messages as one JSON array for outbox_insert, each checked first."""
    rows = []
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise ConfigurationError(
                f"stage_many takes pgqueue.Message objects; item {index} is a "
                f"{type(message).__name__}"
            )
        where = f"message {index} for {message.destination!r}"
        try:
            body = json.dumps(message.message, allow_nan=False, ensure_ascii=False)
            body.encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError: a lone surrogate
            raise InvalidArgumentsError(
                f"{where} is not JSON PostgreSQL can store: {exc}"
            ) from None
        texts = [message.key, message.message_id, message.headers]
        if _has_nul(message.message) or _has_nul(texts):
            raise InvalidArgumentsError(
                f"{where} contains a NUL character (\\x00), which PostgreSQL cannot store"
            )
        if max_payload_bytes is not None and len(body.encode()) > max_payload_bytes:
            raise InvalidArgumentsError(
                f"{where} is {len(body.encode()):,} bytes of JSON, over the queue's "
                f"max_payload_bytes of {max_payload_bytes:,}"
            )
        rows.append(message.model_dump())
    return json.dumps(rows, ensure_ascii=False)


def _has_nul(value: object) -> bool:
    """Whether a NUL character is in any string of a JSON value (PostgreSQL stores none)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_nul(item) for item in value)
    return False


def retry_plan(schema: str, ids: Sequence[int] | None) -> Plan[int]:
    """Stage dead messages again (all, or `ids`); how many."""
    rows = yield query("outbox_retry", schema), {"ids": None if ids is None else list(ids)}
    return one_as(Retried, rows).retried


def stats_plan(schema: str) -> Plan[OutboxStats]:
    row = one_as(Stats, (yield query("outbox_stats", schema), {}))
    return OutboxStats(staged=row.staged, oldest_staged_at=row.oldest_staged, dead=row.dead)


def dead_plan(schema: str, limit: int) -> Plan[list[DeadMessage]]:
    rows = yield query("outbox_list_dead", schema), {"limit": limit}
    return [DeadMessage.model_validate(row, from_attributes=True) for row in rows_as(Dead, rows)]


class OutboxStore:
    """What the relay runs, on its one connection (autocommit)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def lead(self, conn: AsyncConn, name: str) -> bool:
        """Whether this session is now the schema's publishing relay (a session lock)."""
        row = await fetch_one(conn, Lead, query("outbox_lead", self.schema), {"name": name})
        return row.locked

    async def read(self, conn: AsyncConn, after: int, seen: Open, limit: int) -> Read:
        """Up to `limit` committed staged messages after `after`, and at or behind it those
        of the transactions `seen` open by the previous read (see outbox_read)."""
        params = {"after": after, "open": list(seen.xids), "later": seen.later, "limit": limit}
        rows = await fetch(conn, ReadRow, query("outbox_read", self.schema), params)
        first = rows[0]
        return Read(
            messages=[row.staged() for row in rows if row.id is not None],
            open=Open(tuple(first.open or ()), first.later),
        )

    async def delete(self, conn: AsyncConn, ids: Sequence[int]) -> None:
        await execute(conn, query("outbox_delete", self.schema), {"ids": list(ids)})

    async def note_failure(self, conn: AsyncConn, ids: Sequence[int], error: str) -> None:
        params = {"ids": list(ids), "error": error}
        await execute(conn, query("outbox_note_failure", self.schema), params)

    async def kill(self, conn: AsyncConn, refused: dict[int, str]) -> None:
        params = {"ids": list(refused), "errors": list(refused.values())}
        await execute(conn, query("outbox_kill", self.schema), params)
