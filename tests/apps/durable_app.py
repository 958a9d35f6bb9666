"""Ten-step durable jobs for the chaos test (tests/integration/test_durable_chaos.py): one
lease task (`def`, its steps' side effects committed on a connection of their own) and one
atomic task (`async def`, its steps' writes on the job's connection). Each step's run is a
row in a table of the test's schema, so the test can count them.

    pgqueue worker tests.apps.durable_app:queue --schema SCHEMA ...

The lease steps' own connection comes from PGQUEUE_TEST_DSN.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import psycopg
from psycopg import sql

from pgqueue import JobContext, Queue, RetryPolicy

STEPS = 10
queue = Queue()
_local = threading.local()
# Rescues spend attempts (on_lost="retry"): enough for a job to outlive many kills.
ATTEMPTS = 1000
RETRY = RetryPolicy(base=0)


def expected(job_id: int) -> int:
    """What a ten-step job returns: the sum of its steps' results."""
    return sum(step_result(job_id, step) for step in range(1, STEPS + 1))


def step_result(job_id: int, step: int) -> int:
    return job_id * 100 + step


def _conn() -> psycopg.Connection[object]:
    conn: psycopg.Connection[object] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(os.environ["PGQUEUE_TEST_DSN"], autocommit=True)
        _local.conn = conn
    return conn


def lease_run(schema: str, job_id: int, step: int) -> int:
    """A lease step's side effect, committed at once: a rerun would show as a second row."""
    _conn().execute(
        sql.SQL("INSERT INTO {}.chaos_runs (job, step) VALUES (%s, %s)").format(
            sql.Identifier(schema)
        ),
        [job_id, step],
    )
    time.sleep(random.uniform(0, 0.01))
    return step_result(job_id, step)


@queue.task(name="durable_chaos.lease", max_attempts=ATTEMPTS, retry=RETRY)
def lease_job(tables: str, ctx: JobContext) -> int:
    return sum(
        ctx.step(f"s{step}", lease_run, tables, ctx.job_id, step) for step in range(1, STEPS + 1)
    )


async def atomic_run(ctx: JobContext, schema: str, step: int) -> int:
    """An atomic step's write, on the job's connection: it commits with the step's record."""
    await ctx.connection.execute(
        sql.SQL("INSERT INTO {}.chaos_runs (job, step) VALUES (%s, %s)").format(
            sql.Identifier(schema)
        ),
        [ctx.job_id, step],
    )
    await asyncio.sleep(random.uniform(0, 0.01))
    return step_result(ctx.job_id, step)


@queue.task(name="durable_chaos.atomic", atomic=True, max_attempts=ATTEMPTS, retry=RETRY)
async def atomic_job(tables: str, ctx: JobContext) -> int:
    total = 0
    for step in range(1, STEPS + 1):
        total += await ctx.astep(f"s{step}", atomic_run, ctx, tables, step)
    return total
