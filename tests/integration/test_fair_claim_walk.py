"""The fair claim's start counts cost each claim the same however many claims came before it
in the bucket while a long transaction holds the horizon: a claim appends a row of its own
(fairness_start_log), where it used to add to one row per key and bucket, whose dead
versions every later claim of the bucket walked. The sweep's fold moves the log into the
per-bucket counts, and a reader counts each start once, before the fold or after."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import own_buffers
from pgqueue import Queue
from pgqueue.queries import query

# Run on each server CI tests against: the walk is the server's heap and indexes.
pytestmark = pytest.mark.each_server

KEYS = 10
CLAIMS = 200  # each key's bucket row took this many rewrites before
STARTS = ("fairness_start_log", "fairness_starts")


def _params(after: tuple[int, float], now: datetime) -> dict[str, Any]:
    return {
        "queue": "default",
        "after_priority": after[0],
        "after_vtime": after[1],
        "before_priority": 32767,
        "before_vtime": float("inf"),
        "limit": KEYS,
        "worker_id": 1,
        "now": now,
    }


def _claim(db: Any, schema: str, after: tuple[int, float], now: datetime) -> tuple[int, float]:
    """One claim of KEYS jobs from `after`, at `now`: where the next one starts."""
    rows = db.execute(query("job_claim_fair", schema), _params(after, now)).fetchall()
    assert rows
    return max((r[3], r[11]) for r in rows)


def _starts_buffers(db: Any, schema: str, after: tuple[int, float], now: datetime) -> int:
    """The shared buffers the next claim's nodes on the start counts touch (rolled back)."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query("job_claim_fair", schema)
    with db.transaction(force_rollback=True):
        plan = db.execute(explain, _params(after, now)).fetchone()[0][0]["Plan"]
    return sum(n for node, n in own_buffers(plan) if node.get("Relation Name") in STARTS)


def test_fair_claims_start_counts_do_not_walk_the_buckets_dead_rows(
    queue: Queue, app: Any, db: Any, dsn: str, schema: str
) -> None:
    queue.enqueue_many(
        [app.with_options(fairness_key=f"k{i % KEYS}").job(i) for i in range((CLAIMS + 2) * KEYS)]
    )
    now = db.execute("SELECT now()").fetchone()[0]  # every claim in one bucket
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")
        at = _claim(db, schema, (-32768, float("-inf")), now)
        first = _starts_buffers(db, schema, at, now)
        for _ in range(CLAIMS):
            at = _claim(db, schema, at, now)
        last = _starts_buffers(db, schema, at, now)
        holder.rollback()
    # Before: the upsert of each key's bucket row walked its 200 dead versions, hundreds of
    # buffers. Now a row appended: the same few buffers as the bucket's first claims.
    assert last <= first + 2 and last < 20, (first, last)


def test_starts_are_counted_once_before_and_after_the_fold(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.enqueue_many([app.with_options(fairness_key=k).job(i) for k in "ab" for i in range(8)])
    now = db.execute("SELECT now()").fetchone()[0]
    at = _claim(db, schema, (-32768, float("-inf")), now)
    _claim(db, schema, at, now + timedelta(seconds=5))  # the next bucket
    before = {s.key: s.started for s in queue.fair_shares(window=600)}
    db.execute(query("fairness_starts_fold", schema), {"now": now + timedelta(seconds=30)})
    name = sql.Identifier(schema)
    logged = db.execute(sql.SQL("SELECT count(*) FROM {}.fairness_start_log").format(name))
    assert logged.fetchone()[0] == 0
    buckets = db.execute(sql.SQL("SELECT count(*) FROM {}.fairness_starts").format(name))
    assert buckets.fetchone()[0] == 4  # two buckets, two keys
    after = {s.key: s.started for s in queue.fair_shares(window=600)}
    assert before == after == {"a": 8, "b": 8}  # 10 in the first bucket, 6 in the next
