"""The chaos suite's report: one table row per (scenario, mode), as Markdown and JSON.

Owns: formatting only. The numbers come from bench/chaos/count.py; nothing is recomputed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COLUMNS = (
    ("scenario", "scenario"),
    ("mode", "mode"),
    ("enqueued", "enqueued"),
    ("committed", "committed"),
    ("ran_records", "ran (records)"),
    ("ran_history", "ran (history)"),
    ("ran_twice", "ran twice"),
    ("lost", "lost"),
    ("failed", "failed"),
    ("rolled_back_ran", "rolled back but ran"),
    ("stuck_max_s", "stuck max s"),
    ("stuck_p99_s", "stuck p99 s"),
    ("fault_summary", "faults"),
)

LEGEND = """\
- **enqueued**: producer transactions attempted (each inserts an order and enqueues its job);
  **committed**: those that committed (a COMMIT whose answer was lost counts iff its order
  row exists).
- **ran (records)**: distinct committed jobs with a recorded run (lease: a line in a
  per-process file; atomic: a `bench_runs` row written in the job's transaction);
  **ran (history)**: committed jobs in `job_history` as succeeded.
- **ran twice**: jobs with more than one recorded run. Expected for lease jobs after a kill
  (at-least-once); must be 0 for atomic jobs.
- **lost**: committed jobs not finished when the run ended (must be 0); **failed**: committed
  jobs that finished as failed (the handlers never raise, so must be 0).
- **rolled back but ran**: runs or history rows of jobs whose transaction did not commit, or
  whose order does not exist (must be 0).
- **stuck max / p99 s**: `finished_at - created_at` over the committed jobs in history.
"""


def fault_summary(row: dict[str, Any]) -> str:
    events = row.get("faults", [])
    kinds = [e["fault"] for e in events]
    parts = []
    if "kill9" in kinds:
        kills = [e for e in events if e["fault"] == "kill9"]
        parts.append(f"{len(kills)} kills ({sum(1 for e in kills if e['in_flight'])} mid-batch)")
    if "terminate" in kinds:
        hits = [e for e in events if e["fault"] == "terminate"]
        parts.append(f"{len(hits)} terminations ({sum(e['backends'] for e in hits)} backends)")
    if "restart" in kinds:
        restarts = [e for e in events if e["fault"] == "restart"]
        slowest = max(e["seconds"] for e in restarts)
        parts.append(f"{len(restarts)} restarts (slowest {slowest:.1f} s)")
    if "longtx" in kinds:
        (held,) = [e for e in events if e["fault"] == "longtx"]
        parts.append(f"RR tx held {held['held_s']:.0f} s")
    if row.get("scenario") == "rollback":
        parts.append(f"{row['rolled_back']} rolled back")
    return ", ".join(parts) or "-"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|"
        + "|".join("---" if key in ("scenario", "mode") else "---:" for key, _ in COLUMNS)
        + "|",
    ]
    for row in rows:
        if row.get("skipped"):
            cells = [row["scenario"], row["mode"], f"skipped: {row['skipped']}"]
            cells += [""] * (len(COLUMNS) - len(cells))
        else:
            cells = [_cell(row, key) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: dict[str, Any], key: str) -> str:
    if key == "fault_summary":
        return fault_summary(row)
    value = row.get(key)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write(out: Path, summary: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "results.md").write_text(markdown(summary))


def markdown(summary: dict[str, Any]) -> str:
    db = summary["database"]
    s = summary["settings"]
    lines = [
        "# pgqueue chaos suite",
        "",
        f"PostgreSQL {db['server_version']} ({'embedded' if db['embedded'] else 'given DSN'}); "
        + ", ".join(f"{k}={v}" for k, v in db["settings"].items()),
        "",
        f"{s['jobs']:,} enqueue attempts per row at {s['rate']:g}/s from {s['producers']} "
        f"producer processes; {s['workers']} worker processes; handlers work "
        f"{s['work_ms']:g} ms; drain timeout {s['drain_timeout_s']:g} s.",
        "",
        "Worker settings: `" + json.dumps(s["worker_settings"]) + "`",
        "",
        f"Command: `{summary['command']}` ({summary['runtime_s']:.0f} s, "
        f"{summary['host']['cpus']} CPUs)",
        "",
        table(summary["rows"]),
        "",
        LEGEND,
    ]
    problems = summary["problems"]
    lines += ["## Problems", ""] if problems else ["No promise was broken."]
    lines += [f"- {p}" for p in problems]
    if summary["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in summary["warnings"]]
    return "\n".join(lines) + "\n"
