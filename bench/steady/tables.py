"""The steady suite's tables and ratios, read from its results (never measuring anything).

One table per producer count: a row per offered rate and system. The ratios compare pgqueue
with the best peer at the same point (the most jobs finished per second; the lowest p99 and
CPU) and with the bound, all from the same run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COLUMNS = (
    ("produced/s", "produced_per_s", 0),
    ("finished/s", "finished_per_s", 0),
    ("p50 ms", "p50_ms", 2),
    ("p90 ms", "p90_ms", 2),
    ("p99 ms", "p99_ms", 2),
    ("CPU s/1k: producers", "cpu_s_per_1000_producers", 3),
    ("worker", "cpu_s_per_1000_worker", 3),
    ("server", "cpu_s_per_1000_server_backends", 3),
    ("write xacts/job", "xacts_per_job", 2),
    ("WAL B/job", "wal_bytes_per_job", 0),
)


def _point(system: dict[str, Any], producers: int, rate: float) -> dict[str, Any] | None:
    for point in system["points"]:
        if point["producers"] == producers and point["rate"] == rate:
            found: dict[str, Any] = point
            return found
    return None


def cpu_total(point: dict[str, Any]) -> float | None:
    parts = [point.get(f"cpu_s_per_1000_{p}") for p in ("producers", "worker", "server_backends")]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(systems: dict[str, Any], peers: Sequence[str]) -> list[dict[str, Any]]:
    """Per point: pgqueue against the best peer there and against the bound."""
    if "pgqueue" not in systems:
        return []
    found = []
    for mine in systems["pgqueue"]["points"]:
        if "skipped" in mine:
            continue
        at = (mine["producers"], mine["rate"])
        others = [_point(systems[p], *at) for p in peers if p in systems]
        others = [p for p in others if p is not None and "finished_per_s" in p]
        limit = _point(systems["bound"], *at) if "bound" in systems else None
        if limit is not None and "finished_per_s" not in limit:
            limit = None

        def best(key: Any, pick: Any, among: list[dict[str, Any]] = others) -> float | None:
            values = [v for v in (key(p) for p in among) if v is not None]
            return pick(values) if values else None

        def rate(p: dict[str, Any]) -> float | None:
            return p.get("finished_per_s")

        def p99(p: dict[str, Any]) -> float | None:
            return p.get("p99_ms")

        found.append(
            {
                "producers": at[0],
                "rate": at[1],
                "finished_vs_best_peer": _ratio(rate(mine), best(rate, max)),
                "p99_vs_best_peer": _ratio(p99(mine), best(p99, min)),
                "cpu_vs_best_peer": _ratio(cpu_total(mine), best(cpu_total, min)),
                "finished_vs_bound": _ratio(rate(mine), limit and rate(limit)),
                "p99_vs_bound": _ratio(p99(mine), limit and p99(limit)),
                "cpu_vs_bound": _ratio(cpu_total(mine), limit and cpu_total(limit)),
            }
        )
    return found


def _cell(point: dict[str, Any] | None, key: str, digits: int) -> str:
    if point is None:
        return "-"
    value = point.get(key)
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    db, systems = results["database"], results["systems"]
    c = results["config"]
    lines = [
        f"PostgreSQL {db['server_version']}{' (embedded)' if db['embedded'] else ''}; "
        + ", ".join(f"{k}={v}" for k, v in db["settings"].items() if not k.startswith("auto"))
        + f"; {results['host']['cpus']} cores, Python {results['host']['python']}.",
        "",
        f"Command: `{results['command']}`",
        "",
        f"{c['seconds']:g} s of producing per point. Latency: {results['latency']}. CPU: "
        f"{results['cpu']}. Writes: {results.get('writes', 'not measured')}. "
        f"pg_stat_statements: {results['pg_stat_statements']}.",
        "",
        "Settings: "
        + "; ".join(f"{name}: {found['setting']}" for name, found in systems.items())
        + ". Versions: "
        + ", ".join(f"{k} {v}" for k, v in results["versions"].items())
        + ".",
        "",
    ]
    for name, why in results["unavailable"].items():
        lines.append(f"- {name}: {why}")
    for producers in c["producers"]:
        lines += ["", f"### {producers} producer connection(s)", ""]
        lines.append("| offered/s | system | " + " | ".join(h for h, _, _ in COLUMNS) + " |")
        lines.append("|---:|---|" + "---:|" * len(COLUMNS))
        for rate in c["rates"]:
            for name, found in systems.items():
                point = _point(found, producers, rate)
                if point is None:
                    continue
                if "skipped" in point:
                    cells = [point["skipped"]] + ["-"] * (len(COLUMNS) - 1)
                else:
                    cells = [_cell(point, key, digits) for _, key, digits in COLUMNS]
                    if point["fell_behind"]:
                        cells[1] += f" (fell behind: {point['started']:,} of {point['jobs']:,})"
                lines.append(f"| {rate:,.0f} | {name} | " + " | ".join(cells) + " |")
    lines += ["", "### Ratios, this run", "", _ratio_header(), "|---:|---:|" + "---:|" * 6]
    for r in results["ratios"]:
        cells = [r[k] for k in ("finished_vs_best_peer", "p99_vs_best_peer", "cpu_vs_best_peer",
                                "finished_vs_bound", "p99_vs_bound", "cpu_vs_bound")]  # fmt: skip
        shown = ["-" if v is None else f"{v:.2f}" for v in cells]
        lines.append(f"| {r['producers']} | {r['rate']:,.0f} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def _ratio_header() -> str:
    return (
        "| producers | offered/s | finished/s vs best peer | p99 vs best peer | CPU/job vs "
        "best peer | finished/s vs bound | p99 vs bound | CPU/job vs bound |"
    )
