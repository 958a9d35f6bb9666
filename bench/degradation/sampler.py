"""The sampler and the prober of the degradation bench: one row of metrics per second.

Owns: the bench process's two connections (`bench:sampler`, `bench:probe`) and the Sample rows.
The sampler reads the workers' shared counters and one cheap statement of server state (dead
tuples, the oldest transaction). Depth and running jobs are accounted from the counters
(committed by the producer, claimed and finished by the workers); every COUNT_INTERVAL_SECONDS
they are also counted in the table (`depth_counted`) as a check. The bench must not compete
with what it measures: counting a heap with a million dead tuples every second takes a large
share of each second, load the control run did not have.
The prober times the index walk of pgqueue's `job_claim` (the same filter, order and limit on
the same partial index) without its row locks, so it never takes work and never makes a worker
skip a job: every PROBE_INTERVAL_SECONDS with a realistic hint, and every
FLOOR_PROBE_INTERVAL_SECONDS from the floor, which is what an unhinted claim would cost now.
The workers' own unhinted claims are timed on their own (`floor_claim_ms`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import psycopg
from psycopg import sql

from bench.degradation import roles
from bench.degradation.windows import Claims

PROBE_INTERVAL_SECONDS = 1.0
FLOOR_PROBE_INTERVAL_SECONDS = 10.0
COUNT_INTERVAL_SECONDS = 30.0
PROBE_LIMIT = 10  # pgqueue's default concurrency: its largest claim batch


def probe_statement(schema: str) -> sql.Composed:
    """job_claim's index walk (sql/queries/jobs.sql) without FOR UPDATE and the UPDATE."""
    return sql.SQL(
        """SELECT id FROM {}.jobs
WHERE queue = %(queue)s AND status = 'queued' AND NOT atomic
  AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
ORDER BY priority, id
LIMIT {}"""
    ).format(sql.Identifier(schema), sql.Literal(PROBE_LIMIT))


@dataclass(frozen=True)
class Sample:
    """One second of one run. None where there was nothing to measure (written empty)."""

    strategy: str
    mode: str
    t_s: float
    produced_per_s: float
    depth: int
    running: int
    depth_counted: int | None
    claims_per_s: float
    claim_statements_per_s: float
    floor_claims_per_s: float
    completions_per_s: float
    claim_p50_ms: float | None
    claim_p99_ms: float | None
    claim_source: str
    floor_claim_ms: float | None
    probe_hint_ms: float | None
    probe_floor_ms: float | None
    n_dead_tup: int | None
    oldest_xact_s: float | None
    sample_ms: float


COLUMNS = [f.name for f in fields(Sample)]
Hint = Callable[[psycopg.Connection[Any]], tuple[int, int]]


class Prober(threading.Thread):
    """Times job_claim (limit 10) from `hint(conn)` and from the floor, always rolled back."""

    def __init__(self, dsn: str, schema: str, hint: Hint) -> None:
        super().__init__(name="bench-prober", daemon=True)
        self.dsn, self.schema, self.hint = dsn, schema, hint
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._hinted: list[float] = []
        self._floor: list[float] = []

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True, application_name="bench:probe") as conn:
                self._loop(conn)
        except BaseException as exc:  # surfaced by the sampler, which stops the run
            self.error = exc

    def _loop(self, conn: psycopg.Connection[Any]) -> None:
        statement = probe_statement(self.schema)
        next_floor = time.monotonic()
        while not self._halt.is_set():
            started = time.monotonic()
            hinted = self._probe(conn, statement, self.hint(conn))
            floor = self._probe(conn, statement, roles.FLOOR) if started >= next_floor else None
            with self._lock:
                self._hinted.append(hinted)
                if floor is not None:
                    self._floor.append(floor)
                    next_floor = started + FLOOR_PROBE_INTERVAL_SECONDS
            self._halt.wait(max(0.0, started + PROBE_INTERVAL_SECONDS - time.monotonic()))

    def _probe(
        self, conn: psycopg.Connection[Any], statement: Any, after: tuple[int, int]
    ) -> float:
        params = {"queue": roles.QUEUE, "after_priority": after[0], "after_id": after[1]}
        started = time.perf_counter()
        conn.execute(statement, params).fetchall()
        return (time.perf_counter() - started) * 1000

    def take(self) -> tuple[list[float], list[float]]:
        """The hinted and floor probe times (ms) since the last call."""
        with self._lock:
            taken = self._hinted, self._floor
            self._hinted, self._floor = [], []
        return taken

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def history_hint(schema: str) -> Hint:
    """For pgqueue's Worker: after the newest finished job, about where its own hint is."""
    statement = sql.SQL("SELECT priority, id FROM {}.job_history ORDER BY id DESC LIMIT 1").format(
        sql.Identifier(schema)
    )

    def hint(conn: psycopg.Connection[Any]) -> tuple[int, int]:
        row = conn.execute(statement).fetchone()
        return (int(row[0]), int(row[1])) if row else roles.FLOOR

    return hint


def counters_hint(counters: Sequence[Any]) -> Hint:
    """For the plain and hint loops: after the highest id they claimed (bench jobs have
    priority 0)."""

    def hint(conn: psycopg.Connection[Any]) -> tuple[int, int]:
        highest = max(c[roles.MAX_CLAIMED_ID] for c in counters)
        return (0, int(highest)) if highest else roles.FLOOR

    return hint


_STATS = """
SELECT (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %(relid)s) AS dead,
       (SELECT greatest(0, extract(epoch FROM now() - min(xact_start)))::float8
        FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND datname = current_database()) AS oldest
"""

_COUNT = "SELECT count(*) FROM {jobs} WHERE status = 'queued'"


@dataclass(frozen=True)
class _Totals:
    at: float
    produced: int
    claimed: int
    statements: int
    floor: int
    completed: int
    hist: list[int]
    floor_hist: list[int]
    micros: int
    floor_micros: int
    causes: tuple[int, int, int]  # widenings, busy widenings, settlements


class Sampler:
    """Takes one Sample per call to `sample()`, with rates over the time since the last."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        strategy: str,
        mode: str,
        schema: str,
        counters: Sequence[Any],
        produced: Any,
        prober: Prober,
    ) -> None:
        self.conn, self.strategy, self.mode = conn, strategy, mode
        self.counters, self.produced, self.prober = counters, produced, prober
        self.statement = sql.SQL(_STATS)
        self.count = sql.SQL(_COUNT).format(jobs=sql.Identifier(schema, "jobs"))
        row = conn.execute(
            "SELECT c.oid FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = 'jobs'",
            [schema],
        ).fetchone()
        assert row is not None, f"no jobs table in schema {schema}"
        self.relid = int(row[0])
        self.t0 = time.monotonic()
        self._last = self._totals()
        self._next_count = self.t0

    def start(self) -> None:
        """Time zero: the producer starts now."""
        self.t0 = self._next_count = time.monotonic()
        self._last = self._totals()
        self.prober.take()

    def sample(self) -> Sample:
        if self.prober.error is not None:
            raise RuntimeError(f"the claim probe failed: {self.prober.error!r}")
        began = time.perf_counter()
        row = self.conn.execute(self.statement, {"relid": self.relid}).fetchone()
        assert row is not None
        counted = None
        if time.monotonic() >= self._next_count:
            self._next_count += COUNT_INTERVAL_SECONDS
            (counted,) = self.conn.execute(self.count).fetchone() or (None,)
        sample_ms = (time.perf_counter() - began) * 1000
        dead, oldest = row
        now = self._totals()
        last, self._last = self._last, now
        hinted, floor = self.prober.take()
        elapsed = max(now.at - last.at, 1e-6)
        p50, p99, source = self._claim_percentiles(last, now)
        floor_claims = [b - a for a, b in zip(last.floor_hist, now.floor_hist, strict=True)]
        return Sample(
            strategy=self.strategy,
            mode=self.mode,
            t_s=round(now.at - self.t0, 3),
            produced_per_s=(now.produced - last.produced) / elapsed,
            depth=max(0, now.produced - now.claimed),
            running=max(0, now.claimed - now.completed),
            depth_counted=None if counted is None else int(counted),
            claims_per_s=(now.claimed - last.claimed) / elapsed,
            claim_statements_per_s=(now.statements - last.statements) / elapsed,
            floor_claims_per_s=(now.floor - last.floor) / elapsed,
            completions_per_s=(now.completed - last.completed) / elapsed,
            claim_p50_ms=p50,
            claim_p99_ms=p99,
            claim_source=source,
            floor_claim_ms=roles.percentile_ms(floor_claims, 0.5),
            probe_hint_ms=statistics.median(hinted) if hinted else None,
            probe_floor_ms=statistics.median(floor) if floor else None,
            n_dead_tup=None if dead is None else int(dead),
            oldest_xact_s=None if oldest is None else float(oldest),
            sample_ms=sample_ms,
        )

    def _totals(self) -> _Totals:
        rows = [list(c[:]) for c in self.counters]
        column = [sum(r[i] for r in rows) for i in range(roles.SLOTS)]
        return _Totals(
            at=time.monotonic(),
            produced=int(self.produced.value),
            claimed=column[roles.JOBS_CLAIMED],
            statements=column[roles.CLAIM_STATEMENTS],
            floor=column[roles.FLOOR_CLAIMS],
            completed=column[roles.COMPLETIONS],
            hist=column[roles.HIST : roles.FLOOR_HIST],
            floor_hist=column[roles.FLOOR_HIST : roles.FLOOR_HIST + roles.HIST_BUCKETS],
            micros=column[roles.CLAIM_MICROS],
            floor_micros=column[roles.FLOOR_MICROS],
            causes=(
                column[roles.WIDENINGS],
                column[roles.BUSY_WIDENINGS],
                column[roles.SETTLEMENTS],
            ),
        )

    def claims(self) -> Claims:
        """The workers' claim counters now (bench/degradation/windows.py)."""
        now = self._totals()
        return Claims(now.statements, now.floor, now.micros, now.floor_micros, *now.causes)

    def _claim_percentiles(
        self, last: _Totals, now: _Totals
    ) -> tuple[float | None, float | None, str]:
        delta = [b - a for a, b in zip(last.hist, now.hist, strict=True)]
        source = "worker" if self.strategy == "default" else "client"
        return roles.percentile_ms(delta, 0.5), roles.percentile_ms(delta, 0.99), source
