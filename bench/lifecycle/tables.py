"""The lifecycle suite's results.md: every count per 1,000 jobs, one section per scenario."""

from __future__ import annotations

from typing import Any


def per_k(value: float, jobs: int) -> str:
    scaled = value * 1000 / jobs
    return f"{scaled:,.0f}" if abs(scaled) >= 100 else f"{scaled:,.1f}"


def markdown(results: dict[str, Any]) -> str:
    jobs = int(results["jobs"])
    db = results["database"]
    lines = [
        "# lifecycle: what each job costs the server, per 1,000 jobs",
        "",
        f"`{results['command']}`: PostgreSQL {db['server_version']}"
        f" ({'embedded' if db['embedded'] else 'at --dsn'}), {jobs:,} jobs a scenario.",
        "Settings: " + ", ".join(f"{k}={v}" for k, v in sorted(db["settings"].items())) + ".",
        "",
    ]
    if results["missing"]:
        lines += ["Not counted here: " + "; ".join(results["missing"]) + ".", ""]
    lines += summary(results["scenarios"], jobs)
    for name, found in results["scenarios"].items():
        for phase in ("enqueue", "drain"):
            lines += section(f"{name}: {phase}", found[phase], jobs)
    return "\n".join(lines) + "\n"


def totals(cost: dict[str, Any]) -> dict[str, int]:
    tables = cost["tables"].values()
    found = {
        "transactions": cost["transactions"],
        "statements": sum(s["calls"] for s in cost.get("statements", [])),
        "rows inserted": sum(t["inserted"] for t in tables),
        "rows updated": sum(t["updated"] for t in tables),
        "of them HOT": sum(t["hot_updated"] for t in tables),
        "rows deleted": sum(t["deleted"] for t in tables),
        "index entries": sum(cost.get("wal_records", {}).get("index_inserts", {}).values()),
        "WAL records, own tables": sum(
            r["records"]
            for name, r in cost.get("wal_records", {}).get("by_relation", {}).items()
            if not name.startswith("(")
        ),
        "WAL records": cost["wal"]["records"],
        "WAL FPI": cost["wal"]["fpi"],
        "WAL bytes": cost["wal"]["bytes"],
    }
    return found


def timing(cost: dict[str, Any], jobs: int) -> list[str]:
    """Jobs per second of wall time, and CPU seconds per 1,000 jobs of the client and server
    (results from before these were read have none: dashes)."""
    spent = cost.get("cpu")
    if spent is None:
        return ["-"] * 3
    idle = spent.get("start_stop", {})
    wall = spent["wall_s"] - idle.get("wall_s", 0.0)
    # A short drain can take less than its worker's start and stop alone did.
    cells = [f"{jobs / wall:,.0f}" if wall > 0 else "n/a"]
    for key in ("client_cpu_s", "server_cpu_s"):
        value, fixed = spent[key], idle.get(key) or 0.0
        cells.append("n/a" if value is None else f"{(value - fixed) * 1000 / jobs:.3f}")
    return cells


def summary(scenarios: dict[str, Any], jobs: int) -> list[str]:
    columns = list(totals(next(iter(scenarios.values()))["drain"]))
    lines = [
        "## Per 1,000 jobs",
        "",
        "| scenario | phase | " + " | ".join(columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for name, found in scenarios.items():
        for phase in ("enqueue", "drain"):
            row = totals(found[phase])
            lines.append(
                f"| {name} | {phase} | " + " | ".join(per_k(row[c], jobs) for c in columns) + " |"
            )
    lines += [
        "",
        "## Time and CPU",
        "",
        "Wall time is one run's on a shared machine. The CPU seconds per 1,000 jobs are of "
        "the client (the worker process, or the bench itself for the enqueues and the bare "
        "SQL) and of every process of the server. A worker's drain is shown less what a "
        "worker that finds no job spends, in time and on both sides, starting and stopping.",
        "",
        "| scenario | phase | jobs/s | client CPU s/1k | server CPU s/1k |",
        "|---|---|---:|---:|---:|",
    ]
    for name, found in scenarios.items():
        for phase in ("enqueue", "drain"):
            lines.append(f"| {name} | {phase} | " + " | ".join(timing(found[phase], jobs)) + " |")
    return [*lines, ""]


def _exec_ms(statement: dict[str, Any], jobs: int) -> str:
    """Execution time per 1,000 jobs (results from before it was read have none)."""
    ms = statement.get("exec_ms")
    return "-" if ms is None else f"{ms * 1000 / jobs:,.2f}"


def section(title: str, cost: dict[str, Any], jobs: int) -> list[str]:
    lines = [
        f"## {title}",
        "",
        "| table | inserted | updated | HOT | deleted |",
        "|---|---:|---:|---:|---:|",
    ]
    for table, rows in sorted(cost["tables"].items()):
        cells = (rows[k] for k in ("inserted", "updated", "hot_updated", "deleted"))
        lines.append(f"| {table} | " + " | ".join(per_k(v, jobs) for v in cells) + " |")
    inserts = cost.get("wal_records", {}).get("index_inserts", {})
    if inserts:
        lines += ["", "| index | entries inserted |", "|---|---:|"]
        lines += [f"| {index} | {per_k(n, jobs)} |" for index, n in inserts.items()]
    statements = cost.get("statements", [])
    if statements:
        lines += [
            "",
            "| statement | calls | rows | blocks dirtied | WAL records | WAL FPI | WAL bytes "
            "| exec ms |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in statements:
            label = s["name"] or "`" + " ".join(s["query"].split())[:60] + "`"
            cells = (s[k] for k in ("calls", "rows", "blocks_dirtied", "wal_records", "wal_fpi"))
            lines.append(
                f"| {label} | "
                + " | ".join(per_k(v, jobs) for v in cells)
                + f" | {per_k(s['wal_bytes'], jobs)} | {_exec_ms(s, jobs)} |"
            )
    return [*lines, ""]
