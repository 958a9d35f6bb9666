"""What one chaos run did to its jobs, counted from the producers' logs, the runs and history.

Owns: turning a finished run (its schema and run folder) into one result row, and deciding
which of its numbers break the queue's promises: every committed job runs, a
rolled-back one never does, an atomic job's effect happens exactly once.

Sources, each kept apart so they can be compared:
- the producers' lines say which transactions committed (C), rolled back (R), failed before
  COMMIT (E) or lost COMMIT's answer (?); a `?` committed iff its order row exists;
- runs: lease jobs' lines in `runs-*.txt`, atomic jobs' rows in `bench_runs`;
- pgqueue's `job_history` (finished jobs) and `jobs` (still live).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from bench.chaos.app import read_lines
from bench.chaos.faults import Admin

MUST_BE_ZERO = ("lost", "failed", "rolled_back_ran")


@dataclass
class Enqueued:
    """Which job ids committed and which rolled back, from the producers' point of view."""

    attempted: int = 0
    committed: set[int] = field(default_factory=set)
    rolled_back: set[int] = field(default_factory=set)
    committed_orders: set[int] = field(default_factory=set)
    ambiguous: int = 0  # COMMIT sent, answer lost: settled by the order's existence


def enqueued(admin: Admin, schema: str, run_dir: Path) -> Enqueued:
    lines = read_lines(run_dir, "producer")
    result = Enqueued(attempted=len(lines))
    unsure = {int(order): int(job) for job, order, outcome in lines if outcome == "?"}
    result.ambiguous = len(unsure)
    exists = {
        row[0]
        for row in admin.rows(
            sql.SQL("SELECT id FROM {}.bench_orders WHERE id = ANY(%s)").format(
                sql.Identifier(schema)
            ),
            [list(unsure)],
        )
    }
    for job, order, outcome in lines:
        if job == "-":
            continue  # failed before its job was inserted: nothing to find later
        committed = outcome == "C" or (outcome == "?" and int(order) in exists)
        (result.committed if committed else result.rolled_back).add(int(job))
        if committed:
            result.committed_orders.add(int(order))
    return result


def runs(admin: Admin, schema: str, mode: str, run_dir: Path) -> list[tuple[int, int]]:
    """(job id, order id) of every recorded run."""
    if mode == "lease":
        return [(int(job), int(order)) for job, _attempt, order in read_lines(run_dir, "runs")]
    statement = sql.SQL("SELECT job_id, order_id FROM {}.bench_runs").format(sql.Identifier(schema))
    return [(int(job), int(order)) for job, order in admin.rows(statement)]


def measure(admin: Admin, schema: str, mode: str, run_dir: Path) -> dict[str, Any]:
    """The result row of a finished run (its workers and producers already stopped)."""
    s = sql.Identifier(schema)
    made = enqueued(admin, schema, run_dir)
    recorded = runs(admin, schema, mode, run_dir)
    orders = {row[0] for row in admin.rows(sql.SQL("SELECT id FROM {}.bench_orders").format(s))}
    history = admin.rows(
        sql.SQL(
            "SELECT id, status, attempt,"
            " extract(epoch FROM finished_at - created_at)::float8, worker_id,"
            " (SELECT coalesce(jsonb_agg(e->'kind'), '[]') FROM jsonb_array_elements(errors) e)"
            " FROM {}.job_history"
        ).format(s)
    )
    live = {row[0] for row in admin.rows(sql.SQL("SELECT id FROM {}.jobs").format(s))}

    per_job = Counter(job for job, _ in recorded)
    ran = set(per_job)
    finished = {row[0] for row in history}
    succeeded = {row[0] for row in history if row[1] == "succeeded"}
    committed = made.committed
    # A run or a row of a job no committed transaction enqueued: rolled back, yet it ran.
    seen = ran | finished | live
    never_committed = seen - committed
    orphan_runs = sum(1 for _, order in recorded if order not in orders)
    stuck = sorted(row[3] for row in history if row[0] in committed)
    row: dict[str, Any] = {
        "enqueued": made.attempted,
        "committed": len(committed),
        "rolled_back": len(made.rolled_back),
        "ambiguous_commits": made.ambiguous,
        "ran_records": len(ran & committed),
        "ran_history": len(succeeded & committed),
        "ran_twice": sum(1 for n in per_job.values() if n > 1),
        "runs_recorded": len(recorded),
        "lost": len(committed - finished),
        "still_live": len(live & committed),
        "failed": len((finished - succeeded) & committed),
        "rolled_back_ran": len(never_committed & (ran | finished)) + orphan_runs,
        "rolled_back_visible": len(never_committed & live),
        "unexplained_jobs": len(never_committed - made.rolled_back),
        # An order row whose transaction the producer saw roll back: should not exist.
        "orders_without_commit": len(orders - made.committed_orders),
        "retried": sum(1 for r in history if r[2] > 1 and r[0] in committed),
        "stuck_max_s": round(stuck[-1], 3) if stuck else None,
        "stuck_p99_s": round(stuck[max(0, math.ceil(0.99 * len(stuck)) - 1)], 3) if stuck else None,
    }
    twice = sorted(job for job, n in per_job.items() if n > 1)
    row["examples"] = {
        "ran_twice": _describe(twice, history, recorded, live),
        "lost": _describe(sorted(committed - finished), history, recorded, live),
        "rolled_back_ran": _describe(sorted(never_committed), history, recorded, live),
    }
    if mode == "atomic":
        # The effect commits with the completion: each must come with the other, once.
        row["effects_without_completion"] = len(ran - succeeded)
        row["completions_without_effect"] = len(succeeded - ran)
    else:
        row["history_without_record"] = len(succeeded - ran)  # the line died with its process
    return row


def _describe(
    jobs: list[int],
    history: list[tuple[Any, ...]],
    recorded: list[tuple[int, int]],
    live: set[int],
    limit: int = 5,
) -> list[dict[str, Any]]:
    """What the bench knows of a few jobs, for the report of a broken promise."""
    rows = {row[0]: row for row in history}
    described = []
    for job in jobs[:limit]:
        found: dict[str, Any] = {"job": job, "runs": sum(1 for j, _ in recorded if j == job)}
        if job in rows:
            _, status, attempt, _, worker, errors = rows[job]
            found |= {"status": status, "attempt": attempt, "worker": worker, "errors": errors}
        elif job in live:
            found["status"] = "live"
        described.append(found)
    return described


def problems(row: dict[str, Any]) -> list[str]:
    """What in this row breaks a promise (empty when the run is clean or was skipped)."""
    if row.get("skipped"):
        return []
    found = [f"{name} = {row[name]}" for name in MUST_BE_ZERO if row[name]]
    if row["mode"] == "atomic":
        for name in ("ran_twice", "effects_without_completion", "completions_without_effect"):
            if row[name]:
                found.append(f"atomic {name} = {row[name]}")
    if row["orders_without_commit"]:
        found.append(f"orders that exist but rolled back: {row['orders_without_commit']}")
    if row["rolled_back_visible"]:
        found.append(f"rolled-back jobs visible in the jobs table: {row['rolled_back_visible']}")
    for exit_ in row["worker_exits"]:
        found.append(f"worker {exit_['pid']} exited on its own with code {exit_['code']}")
    for code in row["worker_stop_codes"]:
        if code != 0:
            found.append(f"a worker stopped with code {code} after SIGTERM")
    for code in row["producer_codes"]:
        if code != 0:
            found.append(f"a producer exited with code {code}")
    if row["enqueued"] != row["expected_attempts"]:
        found.append(f"producers made {row['enqueued']} of {row['expected_attempts']} attempts")
    for event in row["faults"]:
        if event["fault"] == "longtx" and not event["open_at_end"]:
            found.append("the long transaction was ended before the run did")
    if _unexplained_double_runs(row):
        found.append(
            f"{row['ran_twice']} lease jobs ran twice with no worker killed and no job rescued "
            "or retried: nothing in history explains the second run"
        )
    return found


def _unexplained_double_runs(row: dict[str, Any]) -> bool:
    """At-least-once allows a second run only after a kill or a rescue (an attempt more)."""
    return (
        row["mode"] == "lease"
        and bool(row["ran_twice"])
        and not any(event["fault"] == "kill9" for event in row["faults"])
        and not row["retried"]
    )


def warnings(row: dict[str, Any]) -> list[str]:
    """What is allowed but not expected here: lease jobs run twice although no worker died.

    At-least-once covers a job whose worker was killed or presumed dead (its lease ran out);
    with no kill and no rescue, a second run is a library problem the table alone hides."""
    if row.get("skipped") or row["mode"] != "lease" or not row["ran_twice"]:
        return []
    if any(event["fault"] == "kill9" for event in row["faults"]) or _unexplained_double_runs(row):
        return []  # explained by a kill, or already a problem
    return [
        f"{row['ran_twice']} lease jobs ran twice although no worker was killed"
        f" ({row['retried']} jobs needed more than one attempt)"
    ]
