"""The degradation bench's 10-s windows: depth, waits, and what each kind of claim or scan cost.

Owns: one row per WINDOW_SECONDS of a run (and one for the rest at its end), read on the
sampler's connection. Per window: the largest depth, the enqueue-to-start wait p50/p99 of
the jobs finished in it (job_history's started_at - run_at, read by primary key from the
last id seen, so a window reads only its own rows), and per kind of statement (KINDS) its
calls, total time and shared buffers touched, from pg_stat_statements when the server
preloads it (left empty otherwise, never guessed), and the host's CPU busy share (from
/proc/stat, on Linux): a window whose machine had no CPU to spare says little of the claims.
The hinted and floor claims run the same statements, which pg_stat_statements cannot tell
apart: their counts and times come from the workers' own claim times (roles.py copies them
out of the worker, off its hot path).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgqueue.queries import query

WINDOW_SECONDS = 10

# Which named statements (sql/queries) make each kind of work the table reports.
KINDS: dict[str, tuple[str, ...]] = {
    "claim (hinted + floor)": ("job_claim_unkeyed", "job_claim", "job_claim_rated"),
    "fair claim": ("job_claim_fair",),
    "promotion": ("job_promote_due",),
    "rescuer": (
        "job_find_stranded",
        "job_find_orphaned",
        "job_find_of_workers",
        "job_fail_out_of_range",
        "worker_delete_dead",
        "worker_sessions_gone",
        "worker_delete_gone",
    ),
    "maintenance": (
        "job_history_prune",
        "history_partitions_step",
        "history_partitions_drop",
        "job_steps_prune",
        "periodic_tick_prune",
        "fairness_clock_prune",
        "fairness_key_prune",
        "fairness_starts_fold",
        "fairness_starts_prune",
    ),
    "finish": ("job_finish_many",),
}
STATEMENT_FIELDS = ("calls", "ms", "buffers")

# Constants (pg_stat_statements keeps each as $n: strings, numbers, NULL, true, false and
# extract's field; newer servers fold a list of them into one with a comment), placeholders,
# whitespace, commas and the closing semicolon.
_SHAPE = re.compile(
    r"'(?:[^']|'')*'|-?\$\d+|%\(\w+\)s|-?\b\d+(?:\.\d+)?\b|\s+|;|,|/\*.*?\*/"
    r"|\b(?:NULL|true|false|epoch)\b",
    re.IGNORECASE,
)


def shape(text: str) -> str:
    """A statement's text without its constants, placeholders and whitespace: the same for
    the text in sql/queries and the one pg_stat_statements keeps (constants as $n)."""
    return _SHAPE.sub("", text)


@dataclass(frozen=True)
class Claims:
    """The workers' claim counters: statements, those from the floor, and their times."""

    statements: int
    floor: int
    micros: int
    floor_micros: int
    # Why pgqueue's worker claimed from the floor (interest.py); 0 for the other strategies.
    widenings: int = 0
    busy_widenings: int = 0
    settlements: int = 0


class Windows:
    """Takes a window's row on each call to `take`; `statements` is whether
    pg_stat_statements is there to read."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        schema: str,
        claims: Callable[[], Claims],
        statements: bool,
    ) -> None:
        self.conn, self.claims, self.statements = conn, claims, statements
        self.kind_of = {
            shape(query(name, schema).as_string(conn)): kind
            for kind, names in KINDS.items()
            for name in names
        }
        self.waits = sql.SQL(
            "SELECT max(id), percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP"
            " (ORDER BY extract(epoch FROM started_at - run_at)::float8)"
            " FROM {} WHERE id > %(after)s"
        ).format(sql.Identifier(schema, "job_history"))
        self.after = 0
        self._claims = claims()
        self._statements = self._read_statements()
        self._cpu = cpu_times()

    def _read_statements(self) -> dict[str, tuple[float, ...]]:
        if not self.statements:
            return {}
        found: dict[str, list[float]] = {}
        rows = self.conn.execute(
            "SELECT query, calls, total_exec_time, shared_blks_hit + shared_blks_read"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())"
        ).fetchall()
        for text, calls, ms, buffers in rows:
            kind = self.kind_of.get(shape(str(text)))
            if kind is not None:
                totals = found.setdefault(kind, [0.0, 0.0, 0.0])
                for i, value in enumerate((calls, ms, buffers)):
                    totals[i] += float(value)
        return {kind: tuple(v) for kind, v in found.items()}

    def take(self, t_s: float, depths: Sequence[int]) -> dict[str, Any]:
        """The window that ends now, at `t_s` seconds, whose samples had `depths`."""
        row = self.conn.execute(self.waits, {"after": self.after}).fetchone()
        newest, waits = row if row else (None, None)
        if newest is not None:
            self.after = int(newest)
        claims, last = self.claims(), self._claims
        self._claims = claims
        floor = claims.floor - last.floor
        floor_ms = (claims.floor_micros - last.floor_micros) / 1000
        window: dict[str, Any] = {
            "t_s": t_s,
            "depth_max": max(depths, default=None),
            "wait_p50_s": waits[0] if waits else None,
            "wait_p99_s": waits[1] if waits else None,
            "hinted_claim_calls": claims.statements - last.statements - floor,
            "hinted_claim_ms": (claims.micros - last.micros) / 1000 - floor_ms,
            "floor_claim_calls": floor,
            "floor_claim_ms": floor_ms,
            "widenings": claims.widenings - last.widenings,
            "busy_widenings": claims.busy_widenings - last.busy_widenings,
            "settlements": claims.settlements - last.settlements,
            "cpu_busy": None,
        }
        cpu, was_cpu = cpu_times(), self._cpu
        self._cpu = cpu
        if cpu is not None and was_cpu is not None and cpu[1] > was_cpu[1]:
            window["cpu_busy"] = round((cpu[0] - was_cpu[0]) / (cpu[1] - was_cpu[1]), 3)
        now, before = self._read_statements(), self._statements
        self._statements = now
        for kind in KINDS:
            for i, field in enumerate(STATEMENT_FIELDS):
                key = f"{column(kind)}_{field}"
                if not self.statements:
                    window[key] = None
                else:
                    was = before.get(kind, (0.0,) * 3)[i]
                    window[key] = round(now.get(kind, (0.0,) * 3)[i] - was, 3)
        return window


def cpu_times() -> tuple[int, int] | None:
    """The host's CPU time so far, busy and in all (clock ticks over every CPU), from
    /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle and waiting for I/O
    return sum(ticks) - idle, sum(ticks)


def column(kind: str) -> str:
    """A kind's name as a CSV column prefix."""
    return re.sub(r"[^a-z]+", "_", kind.lower()).strip("_")


def columns() -> list[str]:
    """The windows CSV's columns, in order (before the strategy and mode)."""
    fixed = ["t_s", "depth_max", "wait_p50_s", "wait_p99_s"]
    fixed += ["hinted_claim_calls", "hinted_claim_ms", "floor_claim_calls", "floor_claim_ms"]
    fixed += ["widenings", "busy_widenings", "settlements", "cpu_busy"]
    return fixed + [f"{column(k)}_{f}" for k in KINDS for f in STATEMENT_FIELDS]


def append(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Append window rows to windows.csv, writing the header first if the file is new."""
    names = ["strategy", "mode", *columns()]
    new = not path.exists()
    with path.open("a", newline="") as out:
        writer = csv.writer(out)
        if new:
            writer.writerow(names)
        for row in rows:
            writer.writerow(["" if row.get(n) is None else _round(row[n]) for n in names])


def _round(value: Any) -> Any:
    return round(value, 3) if isinstance(value, float) else value


KIND_ROWS = ("hinted claim", "floor claim", *KINDS)


def _kind_figures(row: dict[str, Any], kind: str) -> tuple[Any, Any, Any]:
    """(calls, ms, buffers) of one kind in one window; None where not measured."""
    if kind in ("hinted claim", "floor claim"):
        prefix = column(kind)
        return row[f"{prefix}_calls"], row[f"{prefix}_ms"], None
    prefix = column(kind)
    calls, ms, buffers = (row[f"{prefix}_{f}"] for f in STATEMENT_FIELDS)
    return calls, ms, buffers


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One run's windows: the worst wait p99 and where, and each kind's totals over the run
    and in that worst window."""
    if not rows:
        return {}
    worst = max(rows, key=lambda r: r["wait_p99_s"] if r["wait_p99_s"] is not None else -1.0)
    kinds: dict[str, Any] = {}
    for kind in KIND_ROWS:
        figures = [_kind_figures(r, kind) for r in rows]
        total = [
            None if any(f[i] is None for f in figures) else round(sum(f[i] for f in figures), 3)
            for i in range(3)
        ]
        kinds[kind] = {
            "run": dict(zip(STATEMENT_FIELDS, total, strict=True)),
            "worst_window": dict(zip(STATEMENT_FIELDS, _kind_figures(worst, kind), strict=True)),
        }
    return {
        "window_s": WINDOW_SECONDS,
        "worst_wait_p99_s": worst["wait_p99_s"],
        "worst_wait_p99_at_s": worst["t_s"],
        "depth_max": max((r["depth_max"] or 0) for r in rows),
        "cpu_busy_worst_window": worst.get("cpu_busy"),
        "cpu_busy_max": max((r.get("cpu_busy") or 0.0 for r in rows), default=None),
        "kinds": kinds,
    }


def _cell(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(runs: Sequence[dict[str, Any]]) -> str:
    """Each run's kinds of claim and scan: calls, ms and buffers over the run, and in the
    window with the worst wait p99."""
    header = (
        f"{'strategy':<8} {'mode':<7} {'kind':<22} {'calls':>9} {'ms':>10} {'buffers':>11} "
        f"{'worst: calls':>12} {'ms':>9} {'buffers':>10}"
    )
    lines = [header, "-" * len(header)]
    for run in runs:
        found = run.get("windows") or {}
        for kind, figures in (found.get("kinds") or {}).items():
            a, w = figures["run"], figures["worst_window"]
            lines.append(
                f"{run['strategy']:<8} {run['mode']:<7} {kind:<22} {_cell(a['calls'], '.0f'):>9} "
                f"{_cell(a['ms'], '.1f'):>10} {_cell(a['buffers'], '.0f'):>11} "
                f"{_cell(w['calls'], '.0f'):>12} {_cell(w['ms'], '.1f'):>9} "
                f"{_cell(w['buffers'], '.0f'):>10}"
            )
    lines.append(
        f"worst: the {WINDOW_SECONDS}-s window with the highest enqueue-to-start wait p99. "
        "Buffers (shared, hit + read) and the other kinds' figures come from "
        "pg_stat_statements ('-' when the server does not preload it); hinted and floor "
        "claims from the workers' own claim times."
    )
    return "\n".join(lines)
