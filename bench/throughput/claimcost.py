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
from pgqueue.worker.claimer import CEILING, FLOOR


def top_up(conn: psycopg.Connection[Any], size: int) -> None:
    row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.jobs").fetchone()
    have = int(row[0]) if row else 0
    if have < size:
        conn.execute(
            f"INSERT INTO {SCHEMA}.jobs (queue, task, args)"
            " SELECT %s, 'noop', jsonb_build_object('seq', n) FROM generate_series(1, %s) AS n",
            [QUEUE, size - have],
        )
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")


def claim_cost(dsn: str, size: int, claims: int, batch: int = 10) -> dict[str, Any]:
    """Median, p95 and max milliseconds of `claims` job_claim statements at `size` queued."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        top_up(conn, size)
    statement = query("job_claim", SCHEMA)
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
