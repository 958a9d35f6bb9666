"""Parked jobs beside the queue: what they cost the claim and a drain.

Owns the measure, on two schemas, one of them holding jobs parked by durable sleeps and
signal waits (bench/durable/parked.py): pgqueue's claim statement at a fixed queued depth
(bench/throughput/claimcost.py), and a burst worker in this process draining queued no-op
jobs beside them; rounds alternate which schema goes first.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.durable import app
from bench.throughput import claimcost
from pgqueue.testing import drain


def _drain(dsn: str, schema: str, jobs: int, concurrency: int) -> float:
    """Jobs per second for a burst worker to drain the queue, topped up to `jobs` queued
    no-op jobs first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        claimcost.top_up(conn, jobs, schema)
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'queued'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    queued = int(row[0]) if row else 0
    started = time.perf_counter()
    stats = drain(app.queue, dsn=dsn, schema=schema, concurrency=concurrency)
    elapsed = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job_history WHERE status <> 'succeeded'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    failed = int(row[0]) if row else -1
    if stats.claimed != queued or failed:
        # A drain of failures times the failure path, not the no-op jobs it claims to.
        raise RuntimeError(
            f"a drain of {queued} jobs in {schema} claimed {stats.claimed}; "
            f"{failed} jobs did not succeed"
        )
    return queued / elapsed


def compare(
    dsn: str,
    schemas: dict[str, str],
    *,
    queued: int,
    claims: int,
    drain_jobs: int,
    concurrency: int,
    rounds: int,
) -> dict[str, Any]:
    """Claim time and drain rate on each schema ("plain", "parked"), in alternating rounds,
    and parked over plain."""
    claim: dict[str, list[dict[str, Any]]] = {name: [] for name in schemas}
    rates: dict[str, list[float]] = {name: [] for name in schemas}
    for r in range(rounds):
        order = list(schemas) if r % 2 == 0 else list(reversed(schemas))
        for name in order:
            claim[name].append(claimcost.claim_cost(dsn, queued, claims, schema=schemas[name]))
        for name in order:
            rates[name].append(round(_drain(dsn, schemas[name], drain_jobs, concurrency), 1))
    found: dict[str, Any] = {}
    for name in schemas:
        found[name] = {
            "claim_ms_p50": round(statistics.median(c["median_ms"] for c in claim[name]), 4),
            "claim_ms_p95": round(statistics.median(c["p95_ms"] for c in claim[name]), 4),
            "claim_runs": claim[name],
            "drain_per_s": statistics.median(rates[name]),
            "drain_runs_per_s": rates[name],
        }
    found["claim_ratio"] = round(
        found["parked"]["claim_ms_p50"] / found["plain"]["claim_ms_p50"], 3
    )
    found["drain_ratio"] = round(found["parked"]["drain_per_s"] / found["plain"]["drain_per_s"], 3)
    return found
