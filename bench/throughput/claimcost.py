"""Workload 5: what one claim costs as the queue grows (1k, 10k, 100k, 1M queued).

Owns: topping pgqueue's jobs table up to each size (server-side INSERT ... generate_series,
then VACUUM ANALYZE), and timing pgqueue's own job_claim statement there, prepared, as a
worker runs it: unhinted (floor to ceiling, the worst case) with the batch of a default worker
(10, its concurrency). Each claim runs in a transaction that is rolled back, so the queue keeps
its size and every claim sees the same head.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from bench.throughput.systems import QUEUE, SCHEMA
from pgqueue.queries import query
from pgqueue.worker.hints import CEILING, FLOOR


def top_up(conn: psycopg.Connection[Any], size: int, schema: str = SCHEMA) -> None:
    """Queued jobs added until `size` are queued (jobs in other states are not counted)."""
    row = conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE status = 'queued'").fetchone()
    have = int(row[0]) if row else 0
    if have < size:
        conn.execute(
            f"INSERT INTO {schema}.jobs (queue, task, args)"
            " SELECT %s, 'noop', jsonb_build_object('seq', n) FROM generate_series(1, %s) AS n",
            [QUEUE, size - have],
        )
    conn.execute(f"VACUUM ANALYZE {schema}.jobs")


def claim_cost(
    dsn: str, size: int, claims: int, batch: int = 10, schema: str = SCHEMA
) -> dict[str, Any]:
    """Median, p95 and max milliseconds of `claims` job_claim statements at `size` queued
    (in `schema`, the throughput bench's own by default)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        top_up(conn, size, schema)
    statement = query("job_claim", schema)
    params = {
        "queue": QUEUE,
        "after_priority": FLOOR[0],
        "after_id": FLOOR[1],
        "before_priority": CEILING[0],
        "before_id": CEILING[1],
        "limit": batch,
        "worker_id": 1,
        "now": None,
    }
    timings: list[float] = []
    with psycopg.connect(dsn, prepare_threshold=0) as conn:
        for _ in range(claims):
            started = time.perf_counter()
            rows = conn.execute(statement, params).fetchall()
            timings.append((time.perf_counter() - started) * 1000)
            conn.rollback()
            if len(rows) != batch:
                raise RuntimeError(f"a claim at {size:,} queued took {len(rows)} of {batch} jobs")
    timings.sort()
    return {
        "queued": size,
        "claims": claims,
        "median_ms": statistics.median(timings),
        "p95_ms": timings[int(0.95 * (len(timings) - 1))],
        "max_ms": timings[-1],
    }
