"""The processes of the degradation bench: producer, claim loops, pgqueue workers, long-runner.

Owns: what each OS process of a run does, and the shared counters they report through. Each
process is started by bench/degradation/suite.py, signals `ready` once it can work, stops when the
run's `stop` event is set, and exits at once if the bench process itself dies (a watchdog
thread waits on the parent's sentinel), so a killed bench leaves no orphans. Ctrl-C is left
to the bench process, which stops its children through `stop`.

Counters are one shared int64 array per worker process with a single writer (the worker)
and one reader (the sampler): totals in the first slots, then a log-bucket histogram of claim
statement times, then one of the unhinted claims among them. Nothing here prints.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from pgqueue import Queue, Worker
from pgqueue.queries import query

QUEUE = "default"
FLOOR = (-32768, 0)  # below every (priority, id): an unhinted claim, as in pgqueue.claimer
CEILING = (32767, 2**63 - 1)  # above every (priority, id), as in pgqueue.claimer
HINT_RESET_SECONDS = 2.0  # pgqueue's default hint_reset_interval, with its ± 50% jitter
HINT_RESET_JITTER = 0.5
IDLE_SECONDS = 0.01  # how long a plain/hint worker waits after finding the queue empty
MAX_BATCH = 1000  # the producer's largest enqueue_many when it has fallen behind

# Counter slots; the histogram follows them.
JOBS_CLAIMED, CLAIM_STATEMENTS, FLOOR_CLAIMS, COMPLETIONS, MAX_CLAIMED_ID = range(5)
HIST = 5
HIST_LOW_SECONDS = 1e-5
HIST_RATIO = 1.05  # bucket width: percentiles are within ± 2.5%
HIST_BUCKETS = 340  # up to about 160 s
FLOOR_HIST = HIST + HIST_BUCKETS  # the unhinted claims' own histogram
# The claims' total time and the unhinted ones', in microseconds (bench/degradation/windows.py).
CLAIM_MICROS = FLOOR_HIST + HIST_BUCKETS
FLOOR_MICROS = CLAIM_MICROS + 1
# Why pgqueue's worker claimed from the floor: its wake interest's widenings (those from busy
# mode among them) and settlements (interest.py).
WIDENINGS, BUSY_WIDENINGS, SETTLEMENTS = FLOOR_MICROS + 1, FLOOR_MICROS + 2, FLOOR_MICROS + 3
SLOTS = SETTLEMENTS + 1

# The no-op task every strategy works: the bench measures the queue, not the handler.
queue = Queue()


@queue.task(name="bench.noop")
async def noop() -> None:
    return None


# -- histogram ---------------------------------------------------------------------------------


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration."""
    if seconds <= HIST_LOW_SECONDS:
        return 0
    index = int(math.log(seconds / HIST_LOW_SECONDS) / math.log(HIST_RATIO))
    return min(index, HIST_BUCKETS - 1)


def percentile_ms(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (nearest rank) of a histogram, in ms at its bucket's midpoint."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return float(HIST_LOW_SECONDS * HIST_RATIO ** (index + 0.5) * 1000)
    return None


# -- process plumbing --------------------------------------------------------------------------


def _as_child() -> None:
    """Leave Ctrl-C to the bench process, and exit at once if it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        multiprocessing.connection.wait([sentinel])
        os._exit(3)

    threading.Thread(target=watch, name="bench-parent-watch", daemon=True).start()


# -- producer ----------------------------------------------------------------------------------


def produce(
    dsn: str,
    schema: str,
    rate: float,
    tick_seconds: float,
    ready: Any,
    go: Any,
    stop: Any,
    produced: Any,
    fairness_keys: int = 0,
) -> None:
    """Enqueue no-op jobs at `rate` per second through the public API, a small batch per tick.

    The number due is computed from the elapsed time, so a slow tick is made up by the next.
    `produced` holds the number of jobs committed so far. With `fairness_keys`, the jobs
    carry fairness keys, round-robin over that many tenants.
    """
    _as_child()
    client = Queue(dsn, schema=schema)
    keyed = [noop.with_options(fairness_key=f"tenant-{k}").job() for k in range(fairness_keys)]
    plain = noop.job()

    def batch_of(n: int, first: int) -> list[Any]:
        if not keyed:
            return [plain] * n
        return [keyed[(first + i) % len(keyed)] for i in range(n)]

    try:
        client.pool()
        ready.set()
        while not go.wait(0.1):
            if stop.is_set():
                return
        start, done, ticks = time.monotonic(), 0, 0
        while not stop.is_set():
            due = int(rate * (time.monotonic() - start)) - done
            while due > 0 and not stop.is_set():
                batch = min(due, MAX_BATCH)
                client.enqueue_many(batch_of(batch, done))
                done += batch
                due -= batch
                produced.value = done
            ticks += 1
            delay = start + ticks * tick_seconds - time.monotonic()
            if delay > 0:
                stop.wait(delay)
    finally:
        client.close()


# -- plain and hint: one job per claim, inline SQL ---------------------------------------------


def claim_statements(
    schema: str, hinted: bool, not_atomic: bool
) -> tuple[sql.Composed, sql.Composed]:
    """The one-job claim (with or without the hint) and the delete that finishes the job.

    The filter is job_claim's (including `NOT atomic` when the jobs table has that column), so
    the claim walks the same partial index as the library's; degradation.py checks the plan.
    """
    hint = (
        sql.SQL("\n      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)")
        if hinted
        else sql.SQL("")
    )
    atomic = sql.SQL("\n      AND NOT atomic") if not_atomic else sql.SQL("")
    claim = sql.SQL(
        """UPDATE {schema}.jobs AS j
SET status = 'running', attempt = j.attempt + 1, started_at = now(), worker_id = %(worker)s
FROM (
    SELECT id FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'{atomic}{hint}
    ORDER BY priority, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
) AS picked
WHERE j.id = picked.id
RETURNING j.id, j.priority"""
    ).format(schema=sql.Identifier(schema), atomic=atomic, hint=hint)
    delete = sql.SQL("DELETE FROM {schema}.jobs WHERE id = %(id)s").format(
        schema=sql.Identifier(schema)
    )
    return claim, delete


def claim_loop(
    dsn: str,
    schema: str,
    hinted: bool,
    not_atomic: bool,
    worker_no: int,
    ready: Any,
    stop: Any,
    counters: Any,
) -> None:
    """Claim one job, delete it, repeat: each statement its own autocommit transaction.

    With `hinted`, the claim starts after the last (priority, id) claimed; the hint goes back to
    the floor every HINT_RESET_SECONDS ± jitter, and at once when a hinted claim finds nothing
    (that claim is retried from the floor straight away). Every claim statement is timed.
    """
    _as_child()
    claim, delete = claim_statements(schema, hinted, not_atomic)
    rng = random.Random(os.getpid())
    params: dict[str, Any] = {"queue": QUEUE, "worker": worker_no}
    hint, deadline = FLOOR, 0.0
    name = f"bench:{'hint' if hinted else 'plain'}"
    with psycopg.connect(dsn, autocommit=True, application_name=name) as conn:
        # The planner settings of pgqueue's own worker sessions, so that the strategies differ
        # only in how they claim (workers.sql, session_prefer_indexes).
        conn.execute(query("session_prefer_indexes", schema))
        ready.set()
        while not stop.is_set():
            if hint != FLOOR and time.monotonic() >= deadline:
                hint = FLOOR
            params["after_priority"], params["after_id"] = hint
            started = time.perf_counter()
            row = conn.execute(claim, params).fetchone()
            _count_claim(counters, time.perf_counter() - started, hint == FLOOR, row)
            if hint == FLOOR:
                deadline = time.monotonic() + HINT_RESET_SECONDS * rng.uniform(
                    1 - HINT_RESET_JITTER, 1 + HINT_RESET_JITTER
                )
            if row is None:
                if hint != FLOOR:
                    hint = FLOOR
                    continue
                stop.wait(IDLE_SECONDS)
                continue
            if hinted:
                hint = (int(row[1]), int(row[0]))
            conn.execute(delete, {"id": row[0]})
            counters[COMPLETIONS] += 1


def _count_claim(counters: Any, seconds: float, floor: bool, row: Any) -> None:
    counters[CLAIM_STATEMENTS] += 1
    counters[HIST + bucket(seconds)] += 1
    counters[CLAIM_MICROS] += int(seconds * 1e6)
    if floor:
        counters[FLOOR_CLAIMS] += 1
        counters[FLOOR_HIST + bucket(seconds)] += 1
        counters[FLOOR_MICROS] += int(seconds * 1e6)
    if row is not None:
        counters[JOBS_CLAIMED] += 1
        if row[0] > counters[MAX_CLAIMED_ID]:
            counters[MAX_CLAIMED_ID] = row[0]


# -- default: pgqueue's own Worker -------------------------------------------------------------


def pgqueue_worker(dsn: str, schema: str, ready: Any, stop: Any, counters: Any) -> None:
    """Run pgqueue.Worker with its defaults over the bench queue until `stop` is set.

    A reporter thread copies worker.stats and the outcomes written (completions) into
    `counters`, and the worker's own claim statement times (stats.recent_claims: every claim,
    hinted, urgent-range and unhinted) into the histograms.
    """
    _as_child()
    worker = Worker(queue, dsn=dsn, schema=schema)
    reporter = threading.Thread(
        target=_report_stats, args=(worker, ready, stop, counters), daemon=True
    )
    reporter.start()
    worker.run()


def _report_stats(worker: Worker, ready: Any, stop: Any, counters: Any) -> None:
    stopping = False
    while True:
        stats = worker.stats
        counters[JOBS_CLAIMED] = stats.claimed
        counters[CLAIM_STATEMENTS] = stats.claims
        counters[FLOOR_CLAIMS] = stats.unhinted_claims
        completer = getattr(worker.current, "completer", None)  # made once it registered
        interest = getattr(worker.current, "interest", None)
        if interest is not None:
            counters[WIDENINGS] = interest.widenings
            counters[BUSY_WIDENINGS] = interest.busy_widenings
            counters[SETTLEMENTS] = interest.settlements
        counters[COMPLETIONS] = completer.written if completer is not None else 0
        recent = stats.recent_claims
        while recent:
            seconds, unhinted = recent.popleft()
            counters[HIST + bucket(seconds)] += 1
            counters[CLAIM_MICROS] += int(seconds * 1e6)
            if unhinted:
                counters[FLOOR_HIST + bucket(seconds)] += 1
                counters[FLOOR_MICROS] += int(seconds * 1e6)
        if worker.id:
            ready.set()  # registered: it is claiming
        if stopping:
            time.sleep(0.05)
        elif stop.wait(0.05):
            stopping = True
            worker.stop()


# -- the long-runner ---------------------------------------------------------------------------


def long_runner(dsn: str, hold_seconds: float | None, ready: Any, stop: Any) -> None:
    """Open a REPEATABLE READ transaction, take its snapshot, and sit idle in it.

    The snapshot holds back the xmin horizon for `hold_seconds` (None: until stopped), so
    nothing that dies in the meantime can be vacuumed or pruned. Then it rolls back and idles.
    """
    _as_child()
    with psycopg.connect(dsn, application_name="bench:long-runner") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT count(*) FROM pg_class").fetchone()  # takes the snapshot
        ready.set()
        stop.wait(hold_seconds)
        conn.rollback()
        stop.wait()
