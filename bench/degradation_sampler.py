"""The sampler and the prober of the degradation bench: one row of metrics per second.

Owns: the bench process's two connections (`bench:sampler`, `bench:probe`) and the Sample rows.
The sampler reads the workers' shared counters and one statement of table and server state.
The prober times the index walk of pgqueue's `job_claim` (the same filter, order and limit on
the same partial index) without its row locks, so it never takes work and never makes a worker
skip a job: every PROBE_INTERVAL_SECONDS with a realistic hint, and once a second from the
floor (unhinted), which is what an unhinted claim would cost now.
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

from bench import degradation_roles as roles

PROBE_INTERVAL_SECONDS = 0.25
PROBE_LIMIT = 10  # pgqueue's default concurrency: its largest claim batch


def probe_statement(schema: str) -> sql.Composed:
    """job_claim's index walk (sql/queries/worker.sql) without FOR UPDATE and the UPDATE."""
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
    claims_per_s: float
    claim_statements_per_s: float
    floor_claims_per_s: float
    completions_per_s: float
    claim_p50_ms: float | None
    claim_p99_ms: float | None
    claim_source: str
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
                    next_floor = started + 1.0
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
WITH live AS (
    SELECT count(*) FILTER (WHERE status = 'queued') AS depth,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM {jobs}
)
SELECT live.depth, live.running,
       (SELECT count(*) FROM {history}) AS finished,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = %(relid)s) AS dead,
       (SELECT greatest(0, extract(epoch FROM now() - min(xact_start)))::float8
        FROM pg_stat_activity
        WHERE pid <> pg_backend_pid() AND datname = current_database()) AS oldest
FROM live
"""


@dataclass(frozen=True)
class _Totals:
    at: float
    produced: int
    claimed: int
    statements: int
    floor: int
    completed: int
    hist: list[int]


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
        self.statement = sql.SQL(_STATS).format(
            jobs=sql.Identifier(schema, "jobs"), history=sql.Identifier(schema, "job_history")
        )
        row = conn.execute(
            "SELECT c.oid FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = 'jobs'",
            [schema],
        ).fetchone()
        assert row is not None, f"no jobs table in schema {schema}"
        self.relid = int(row[0])
        self.t0 = time.monotonic()
        self._last = self._totals(finished=0)

    def start(self) -> None:
        """Time zero: the producer starts now."""
        self.t0 = time.monotonic()
        self._last = self._totals(finished=0)
        self.prober.take()

    def sample(self) -> Sample:
        if self.prober.error is not None:
            raise RuntimeError(f"the claim probe failed: {self.prober.error!r}")
        began = time.perf_counter()
        row = self.conn.execute(self.statement, {"relid": self.relid}).fetchone()
        assert row is not None
        sample_ms = (time.perf_counter() - began) * 1000
        depth, running, finished, dead, oldest = row
        now = self._totals(finished=int(finished))
        last, self._last = self._last, now
        hinted, floor = self.prober.take()
        elapsed = max(now.at - last.at, 1e-6)
        p50, p99, source = self._claim_percentiles(last, now)
        return Sample(
            strategy=self.strategy,
            mode=self.mode,
            t_s=round(now.at - self.t0, 3),
            produced_per_s=(now.produced - last.produced) / elapsed,
            depth=int(depth),
            running=int(running),
            claims_per_s=(now.claimed - last.claimed) / elapsed,
            claim_statements_per_s=(now.statements - last.statements) / elapsed,
            floor_claims_per_s=(now.floor - last.floor) / elapsed,
            completions_per_s=(now.completed - last.completed) / elapsed,
            claim_p50_ms=p50,
            claim_p99_ms=p99,
            claim_source=source,
            probe_hint_ms=statistics.median(hinted) if hinted else None,
            probe_floor_ms=statistics.median(floor) if floor else None,
            n_dead_tup=None if dead is None else int(dead),
            oldest_xact_s=None if oldest is None else float(oldest),
            sample_ms=sample_ms,
        )

    def _totals(self, finished: int) -> _Totals:
        rows = [list(c[:]) for c in self.counters]
        column = [sum(r[i] for r in rows) for i in range(roles.SLOTS)]
        # pgqueue's Worker finishes a job by moving it to job_history: count those rows there.
        completed = finished if self.strategy == "default" else column[roles.COMPLETIONS]
        return _Totals(
            at=time.monotonic(),
            produced=int(self.produced.value),
            claimed=column[roles.JOBS_CLAIMED],
            statements=column[roles.CLAIM_STATEMENTS],
            floor=column[roles.FLOOR_CLAIMS],
            completed=completed,
            hist=column[roles.HIST :],
        )

    def _claim_percentiles(
        self, last: _Totals, now: _Totals
    ) -> tuple[float | None, float | None, str]:
        delta = [b - a for a, b in zip(last.hist, now.hist, strict=True)]
        source = "worker" if self.strategy == "default" else "client"
        return roles.percentile_ms(delta, 0.5), roles.percentile_ms(delta, 0.99), source
