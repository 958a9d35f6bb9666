"""Reading values that PostgreSQL accepts and Python cannot hold, without raising.

Owns: the loaders for pgqueue's own reads of job rows (the worker's connections, get_job and
list_jobs). A row written behind pgqueue's back may hold a time past year 9999 or before year
1 (`infinity` included), or JSON that Python refuses (an integer of thousands of digits,
nesting deeper than the recursion limit). With psycopg's loaders one such row fails the whole
statement: a worker could not claim or promote on its queue, and get_job could not read any
page that held it. Here a time out of range reads as the nearest one Python has, and JSON it
cannot read as an `Unreadable` value that says why, so the job itself can be failed with that
reason while everything around it goes on.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from psycopg import DataError
from psycopg.abc import AdaptContext, Buffer
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads

from pgqueue.codec import decode_json

LATEST = datetime.max.replace(tzinfo=timezone.utc)  # what a later time, or infinity, reads as
EARLIEST = datetime.min.replace(tzinfo=timezone.utc)


class Unreadable(dict[str, Any]):
    """JSON that Python cannot read, standing where its value would: a dict whose one key,
    "unreadable", says why, so it shows as such wherever the value is shown."""

    def __init__(self, reason: str) -> None:
        super().__init__(unreadable=reason)
        self.reason = reason


class _Timestamptz(TimestamptzLoader):
    def load(self, data: Buffer) -> datetime:
        try:
            return super().load(data)
        except DataError:
            text = bytes(data)
            return EARLIEST if text.startswith(b"-") or text.endswith(b"BC") else LATEST


def load_json(data: str | bytes) -> Any:
    """decode_json, or an Unreadable value naming the reason."""
    try:
        return decode_json(data)
    except (ValueError, RecursionError) as exc:
        return Unreadable(f"{type(exc).__name__}: {exc}"[:500])


def tolerate(context: AdaptContext) -> None:
    """Make a connection or cursor read out-of-range times and unreadable JSON as above."""
    context.adapters.register_loader("timestamptz", _Timestamptz)
    set_json_loads(load_json, context)
