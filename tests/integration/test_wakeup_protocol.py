"""The SQL functions that build the wake-up channel's payloads, read back by pgqueue/wakeup.py:
the one builder and the one parser of that protocol agree."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue.queries import channel
from pgqueue.wakeup import CancelRequest, Wake, parse
from tests.conftest import listen_for_wakes

# Run on each server CI tests against: wake-ups are the server's notifications.
pytestmark = pytest.mark.each_server


def test_what_wake_and_wake_cancel_send_parses_back(dsn: str, schema: str) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as sender,
    ):
        listen_for_wakes(listener, schema, ("mail",))
        sender.execute(
            sql.SQL("SELECT {s}.wake('mail', -5, 42), {s}.wake_cancel(17)").format(
                s=sql.Identifier(schema)
            )
        )
        got = [parse(n.payload) for n in listener.notifies(timeout=10, stop_after=2)]
    assert got == [Wake("mail", (-5, 42)), CancelRequest(17)]


def _wakes_sent(dsn: str, schema: str, calls: str, isolation: str = "READ COMMITTED") -> list[str]:
    """The wake-ups that a transaction calling wake() as `calls` says sends to a listener
    that has no worker rows of its own."""
    s = sql.Identifier(schema)
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn) as sender,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        sender.execute(sql.SQL("SET TRANSACTION ISOLATION LEVEL " + isolation))
        sender.execute(sql.SQL(calls).format(s=s))
        sender.commit()
        sender.execute(sql.SQL("SELECT {s}.wake_cancel(0)").format(s=s))  # an end marker
        sender.commit()
        notes = [n.payload for n in _until_marker(listener)]
    assert notes and notes[-1] == "!cancel 0", notes
    return notes[:-1]


def _skip(dsn: str, schema: str, rows: list[tuple[str, int, int]]) -> None:
    """Worker rows skipping the wake-ups of jobs with a priority from `below` to `above`."""
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for queue, below, above in rows:
            conn.execute(
                sql.SQL(
                    "WITH w AS (INSERT INTO {s}.workers (name, hostname, pid, queues, concurrency)"
                    " VALUES ('w', 'h', 1, ARRAY[%(q)s], 1) RETURNING id)"
                    " INSERT INTO {s}.wake_listeners (worker_id, queue, below, above)"
                    " SELECT id, %(q)s, %(below)s, %(above)s FROM w"
                ).format(s=s),
                {"q": queue, "below": below, "above": above},
            )


def test_wake_notifies_only_when_a_worker_wants_that_queue_and_priority(
    dsn: str, schema: str
) -> None:
    calls = (
        "SELECT {s}.wake('mail', 0, 1), {s}.wake('sms', 3, 2), {s}.wake('sms', 7, 3),"
        " {s}.wake('sms', 5, 4)"
    )
    assert _wakes_sent(dsn, schema, calls) == []  # no worker waits: no notice, no lock
    _skip(dsn, schema, [("sms", 5, 32767)])  # a busy worker whose hint is at priority 5
    assert _wakes_sent(dsn, schema, calls) == ["sms 3 2"]
    _skip(dsn, schema, [("sms", 3, 3)])  # another, claiming an announced range of priority 3
    assert _wakes_sent(dsn, schema, calls) == ["sms 3 2", "sms 7 3", "sms 5 4"]
    _skip(dsn, schema, [("mail", 32768, 32767)])  # a waiting worker
    assert _wakes_sent(dsn, schema, calls) == ["mail 0 1", "sms 3 2", "sms 7 3", "sms 5 4"]


def test_wake_notifies_regardless_under_a_snapshot_older_than_the_statement(
    dsn: str, schema: str
) -> None:
    # Under REPEATABLE READ the check could miss a worker that asked after the transaction's
    # snapshot was taken, so wake() does not check at all there.
    calls = "SELECT {s}.wake('mail', 0, 1)"
    for isolation in ("REPEATABLE READ", "SERIALIZABLE"):
        assert _wakes_sent(dsn, schema, calls, isolation) == ["mail 0 1"]
    assert _wakes_sent(dsn, schema, calls) == []


def _until_marker(listener: psycopg.Connection[Any]) -> list[Any]:
    notes = []
    for note in listener.notifies(timeout=10):
        notes.append(note)
        if note.payload == "!cancel 0":
            break
    return notes
