"""What Citus itself costs its nodes for one row written through the coordinator, beside one
plain server: the floor under any job enqueued that way, pgqueue's or another's.

Owns: one table of a key and a 100-byte payload, distributed by the key on the cluster and
plain on the single server; as many one-row inserts as the bench has jobs, each in its own
transaction (as an application's enqueue), from PRODUCERS threads; each server's CPU, WAL and
statements per row. No pgqueue code runs: the ratio of the nodes' cost to the single
server's is Citus's own, for a routed single-row transaction.
"""

from __future__ import annotations

from typing import Any

import psycopg

from bench.citus.meters import Meter, per_job, readings
from bench.citus.produce import PRODUCERS, in_threads

TABLE = "bench_citus_floor"


def run(single: list[Meter], cluster: list[Meter], rows: int, keys: int) -> dict[str, Any]:
    """Each system's cost per row: {"single": {...}, "cluster": {role: {...}}}."""
    return {
        "single": _one(single, rows, keys, distribute=False),
        "cluster": _one(cluster, rows, keys, distribute=True),
    }


def _one(meters: list[Meter], rows: int, keys: int, *, distribute: bool) -> dict[str, Any]:
    dsn = meters[0].dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (key text NOT NULL, id bigserial, payload text)")
        if distribute:
            conn.execute("SELECT create_distributed_table(%s, 'key')", [TABLE])

    def produce(start: int) -> None:
        with psycopg.connect(dsn) as conn:
            for n in range(start, rows, PRODUCERS):
                conn.execute(
                    f"INSERT INTO {TABLE} (key, payload) VALUES (%s, %s)",
                    [f"tenant-{n % keys}", "x" * 100],
                )
                conn.commit()

    try:
        before = readings(meters)
        in_threads(produce)
        after = readings(meters)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    return per_job(before, after, rows)
