"""The application the Citus suite's worker processes run: tasks that record each run in a
table of the coordinator, so a test counts what ran and where. The coordinator's DSN and the
schema come from the environment the test gives the process."""

from __future__ import annotations

import os
import time

import psycopg
from psycopg import sql

from pgqueue import RetryPolicy
from pgqueue.citus import CitusQueue

queue = CitusQueue(
    os.environ.get("CITUS_APP_DSN") or None, schema=os.environ.get("CITUS_APP_SCHEMA", "pgqueue")
)


def runs_table(conn: psycopg.Connection[object], schema: str) -> None:
    """The table each run of `record` writes to, on the coordinator."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.runs (job_id bigint, tenant_id text, n int, pid int)"
        ).format(sql.Identifier(schema))
    )


@queue.task(name="citus.record", shard_key="{tenant_id}")
def record(tenant_id: str, n: int, sleep: float = 0.0) -> None:
    time.sleep(sleep)
    with psycopg.connect(os.environ["CITUS_APP_DSN"]) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.runs (tenant_id, n, pid) VALUES (%s, %s, %s)").format(
                sql.Identifier(os.environ["CITUS_APP_SCHEMA"])
            ),
            [tenant_id, n, os.getpid()],
        )


@queue.task(
    name="citus.fail", shard_key="{tenant_id}", max_attempts=2, retry=RetryPolicy(base=0.05)
)
def fail(tenant_id: str) -> None:
    raise RuntimeError(f"no luck for {tenant_id}")
