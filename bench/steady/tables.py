"""The steady suite's tables and ratios, read from its results (never measuring anything).

One table per producer count: a row per offered rate and system. The ratios compare pgqueue
with the best peer at the same point (the most jobs finished per second; the lowest p99 and
CPU) and with the bounds, all from the same run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

# The ratio columns, in order (results from before bound_psycopg or bound_python lack theirs).
RATIOS = (
    "finished_vs_best_peer", "p99_vs_best_peer", "cpu_vs_best_peer", "finished_vs_bound",
    "p99_vs_bound", "cpu_vs_bound", "finished_vs_bound_psycopg", "p99_vs_bound_psycopg",
    "finished_vs_bound_python", "p99_vs_bound_python", "cpu_vs_bound_python",
)  # fmt: skip


def _point(system: dict[str, Any], producers: int, rate: float) -> dict[str, Any] | None:
    for point in system["points"]:
        if point["producers"] == producers and point["rate"] == rate:
            found: dict[str, Any] = point
            return found
    return None


def cpu_total(point: dict[str, Any]) -> float | None:
    parts = [point.get(f"cpu_s_per_1000_{p}") for p in ("producers", "worker", "server_backends")]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


def rate(point: dict[str, Any]) -> float | None:
    return point.get("finished_per_s")


def p99(point: dict[str, Any]) -> float | None:
    return point.get("p99_ms")


Key = Callable[[dict[str, Any]], float | None]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(systems: dict[str, Any], peers: Sequence[str]) -> list[dict[str, Any]]:
    """Per point: pgqueue against the best peer there and against each bound."""
    if "pgqueue" not in systems:
        return []
    rows = []
    for mine in systems["pgqueue"]["points"]:
        if "skipped" in mine:
            continue
        at = (mine["producers"], mine["rate"])
        others = [p for p in (_measured(systems, name, at) for name in peers) if p is not None]
        limit, python, bare = (
            _measured(systems, name, at) for name in ("bound", "bound_psycopg", "bound_python")
        )
        rows.append(
            {
                "producers": at[0],
                "rate": at[1],
                "finished_vs_best_peer": _ratio(rate(mine), _best(rate, others, max)),
                "p99_vs_best_peer": _ratio(p99(mine), _best(p99, others, min)),
                "cpu_vs_best_peer": _ratio(cpu_total(mine), _best(cpu_total, others, min)),
                "finished_vs_bound": _vs(rate, mine, limit),
                "p99_vs_bound": _vs(p99, mine, limit),
                "cpu_vs_bound": _vs(cpu_total, mine, limit),
                "finished_vs_bound_psycopg": _vs(rate, mine, python),
                "p99_vs_bound_psycopg": _vs(p99, mine, python),
                "finished_vs_bound_python": _vs(rate, mine, bare),
                "p99_vs_bound_python": _vs(p99, mine, bare),
                "cpu_vs_bound_python": _vs(cpu_total, mine, bare),
            }
        )
    return rows


def _best(key: Key, among: list[dict[str, Any]], pick: Any) -> float | None:
    values = [v for v in (key(p) for p in among) if v is not None]
    found: float | None = pick(values) if values else None
    return found


def _vs(key: Key, mine: dict[str, Any], other: dict[str, Any] | None) -> float | None:
    return _ratio(key(mine), None if other is None else key(other))


def _measured(systems: dict[str, Any], name: str, at: tuple[int, float]) -> dict[str, Any] | None:
    """`name`'s point at `at`, if it ran and measured jobs finishing."""
    found = _point(systems[name], *at) if name in systems else None
    return found if found is not None and "finished_per_s" in found else None


def _cell(point: dict[str, Any] | None, key: str, digits: int) -> str:
    if point is None:
        return "-"
    value = point.get(key)
    if value is None:
        return "n/a"
    if isinstance(value, list):  # one figure a round
        return " / ".join("n/a" if v is None else f"{v:,.{digits}f}" for v in value)
    return f"{value:,.{digits}f}"


def _columns(rounds: int) -> tuple[tuple[str, str, int], ...]:
    """The table's columns: with several rounds, each round's p99 follows their median."""
    if rounds <= 1:
        return COLUMNS
    at = [key for _, key, _ in COLUMNS].index("p99_ms") + 1
    return (*COLUMNS[:at], ("p99 ms, each round", "rounds_p99_ms", 1), *COLUMNS[at:])


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
    ]
    rounds = c.get("rounds", 1)
    if rounds > 1:
        lines += [
            f"{rounds} rounds, every system once a round in a rotated order; each figure is "
            "the point's median of the rounds, and the ratios are of those medians.",
            "",
        ]
    lines += [
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
        columns = _columns(rounds)
        lines.append("| offered/s | system | " + " | ".join(h for h, _, _ in columns) + " |")
        lines.append("|---:|---|" + "---:|" * len(columns))
        for rate in c["rates"]:
            for name, found in systems.items():
                point = _point(found, producers, rate)
                if point is None:
                    continue
                if "skipped" in point:
                    cells = [point["skipped"]] + ["-"] * (len(columns) - 1)
                else:
                    cells = [_cell(point, key, digits) for _, key, digits in columns]
                    if point["fell_behind"]:
                        cells[1] += f" (fell behind: {point['started']:,} of {point['jobs']:,})"
                lines.append(f"| {rate:,.0f} | {name} | " + " | ".join(cells) + " |")
    rule = "|---:|---:|" + "---:|" * len(RATIOS)
    lines += ["", "### Ratios, this run", "", _ratio_header(), rule]
    for r in results["ratios"]:
        cells = [r.get(k) for k in RATIOS]
        shown = ["-" if v is None else f"{v:.2f}" for v in cells]
        lines.append(f"| {r['producers']} | {r['rate']:,.0f} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def _ratio_header() -> str:
    return (
        "| producers | offered/s | finished/s vs best peer | p99 vs best peer | CPU/job vs "
        "best peer | finished/s vs bound | p99 vs bound | CPU/job vs bound | finished/s vs "
        "bound_psycopg | p99 vs bound_psycopg | finished/s vs bound_python | p99 vs "
        "bound_python | CPU/job vs bound_python |"
    )
