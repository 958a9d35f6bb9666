"""Jobs parked by durable sleeps and signal waits, written in SQL as the runtime leaves them.

`ctx.sleep` records its end as a step (a job_steps row of kind `sleep`), then gives the job
back as a snooze does (job_finish_many): status `scheduled`, run_at at the sleep's end, no
worker, its attempt given back, started_at kept. `ctx.wait_for_signal` with nothing to take
parks the job (signal_park): `scheduled` with run_at at the wait's timeout, no worker, its
attempt given back, and a signal_waits row for its key; it records no step. The benches
measure claims and drains beside such jobs, not how they got there, so they are inserted
directly: a sleep of a day, and waits with a timeout of seven days, one key each.

The durable suite (bench/durable/claims.py) and the degradation bench (`--sleeping`) put
them beside the jobs they measure.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

SLEEP = "1 day"
SETUP = (
    "inserted in SQL as the runtime leaves them: half sleeping (status scheduled, run_at a "
    "day ahead, attempt given back, a job_steps row of kind sleep recording its end), half "
    "waiting for a signal (scheduled, run_at at a 7-day timeout, attempt given back, a "
    "signal_waits row, one key each)"
)
WAIT_TIMEOUT = "7 days"


def add_parked(
    conn: psycopg.Connection[Any], schema: str, jobs: int, queue: str = "default"
) -> dict[str, int]:
    """`jobs` parked jobs in `queue`: half sleeping, half waiting for a signal. Returns how
    many of each. The caller commits (or runs in autocommit)."""
    sleeping = jobs // 2
    waiting = jobs - sleeping
    names = {"s": sql.Identifier(schema)}
    conn.execute(
        sql.SQL(
            """
            WITH parked AS (
                INSERT INTO {s}.jobs (queue, task, args, status, run_at, attempt, started_at)
                SELECT %(queue)s, 'noop', jsonb_build_object('n', n), 'scheduled',
                       now() + %(sleep)s::interval, 0, now()
                FROM generate_series(1, %(n)s) AS n
                RETURNING id, run_at
            )
            INSERT INTO {s}.job_steps (job_id, seq, name, kind, result, started_at)
            SELECT id, 1, 'sleep', 'sleep',
                   jsonb_build_object('until', run_at, 'until_epoch', extract(epoch FROM run_at)),
                   now()
            FROM parked
            """
        ).format(**names),
        {"queue": queue, "n": sleeping, "sleep": SLEEP},
    )
    conn.execute(
        sql.SQL(
            """
            WITH parked AS (
                INSERT INTO {s}.jobs (queue, task, args, status, run_at, attempt, started_at)
                SELECT %(queue)s, 'noop', jsonb_build_object('n', n), 'scheduled',
                       now() + %(timeout)s::interval, 0, now()
                FROM generate_series(1, %(n)s) AS n
                RETURNING id, run_at
            )
            INSERT INTO {s}.signal_waits (job_id, key, seq, until)
            SELECT id, 'bench-signal-' || id, 1, run_at FROM parked
            """
        ).format(**names),
        {"queue": queue, "n": waiting, "timeout": WAIT_TIMEOUT},
    )
    for table in ("jobs", "job_steps", "signal_waits"):
        conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(names["s"], sql.Identifier(table)))
    return {"sleeping": sleeping, "waiting_for_signal": waiting}
