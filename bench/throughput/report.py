"""The throughput bench's outputs: the targets set for pgqueue, the markdown tables and the charts.

Owns: reading the results dict built by bench/throughput/suite.py (never measuring anything) and
writing results.json, results.md and the PNG charts. Every figure is shown as
`median (min-max)` over the runs; a row that could not be measured says why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput.raw import SHAPES

PEERS = ("procrastinate", "pgqueuer", "chancy", "oban")
# How a section's rows of one system at several settings are ranked: the best is the one a
# table shows (naming its setting); results.json keeps them all.
RANKED_BY = {"idle": ("p50_ms", min), "steady": ("p50_ms", min)}
# The peers as their own projects name them, in the README's table.
TITLES = {
    "procrastinate": "procrastinate",
    "pgqueuer": "PgQueuer",
    "chancy": "Chancy",
    "oban": "oban-py",
}
CHARTS = ("drain.png", "enqueue.png", "latency.png", "claim_cost.png")


# -- reading results ---------------------------------------------------------------------------


def rows(results: dict[str, Any], section: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = results["workloads"].get(section, {}).get("rows", [])
    return found


def find(
    results: dict[str, Any], section: str, system: str | None = None, **params: Any
) -> dict[str, Any] | None:
    """The matching row; of several (one system at several settings), the best measured one
    (the highest jobs/s, or for latency the lowest p50), else the first."""
    found = [
        row
        for row in rows(results, section)
        if (system is None or row["system"] == system)
        and all(row["params"].get(k) == v for k, v in params.items())
    ]
    measured = [row for row in found if "summary" in row]
    key, pick = RANKED_BY.get(section, ("jobs_per_s", max))
    measured = [row for row in measured if key in row["summary"]]
    if measured:
        return pick(measured, key=lambda row: row["summary"][key]["median"])
    return found[0] if found else None


def setting(row: dict[str, Any] | None) -> str:
    """The setting a row ran at, as a table names it beside its figure."""
    name = None if row is None else row["params"].get("setting")
    return f" [{name}]" if name and name != "default" else ""


def raw_rows(results: dict[str, Any], workload: str, **params: Any) -> list[dict[str, Any]]:
    """The raw-bound rows of one pgbench workload (all client counts), matching `params`."""
    return [
        r
        for r in rows(results, "raw")
        if r["params"]["workload"] == workload
        and all(r["params"].get(k) == v for k, v in params.items())
    ]


def median(row: dict[str, Any] | None, key: str) -> float | None:
    if row is None or "summary" not in row or key not in row["summary"]:
        return None
    value: float = row["summary"][key]["median"]
    return value


def best(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


# -- targets -----------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's targets, each as measured / goal / met (None: not measured in this run)."""
    rate = "jobs_per_s"
    drain_rows = [r for r in rows(results, "drain") if r["system"] == "pgqueue"]
    pgqueue_drain = best([median(r, rate) for r in drain_rows])
    peer_drain = best([median(r, rate) for r in rows(results, "drain") if r["system"] in PEERS])
    default_batch = median(find(results, "drain", "pgqueue", concurrency=100), rate)
    raw_100 = best([median(r, rate) for r in raw_rows(results, "claim_delete", batch=100)])
    seq = median(find(results, "enqueue", "pgqueue", mode="sequential"), rate)
    conc = median(find(results, "enqueue", "pgqueue", mode="concurrent"), rate)
    bulk = median(find(results, "enqueue", "pgqueue", mode="bulk"), rate)
    raw_one = median(find(results, "raw", workload="insert", clients=1), rate)
    raw_many = best(
        [median(r, rate) for r in raw_rows(results, "insert") if r["params"]["clients"] > 1]
    )
    raw_copy = median(find(results, "raw", workload="copy"), rate)
    idle = find(results, "idle", "pgqueue")
    claims = [r for r in rows(results, "claim") if "summary" in r]
    claim_growth = (
        _ratio(median(claims[-1], "median_ms"), median(claims[0], "median_ms"))
        if len(claims) > 1
        else None
    )
    drain_peer = "drain: pgqueue best / fastest Python peer best"
    drain_raw = "drain: pgqueue at batch 100 / raw claim-and-delete at batch 100"
    seq_raw = "enqueue one per transaction: sequential / raw single-row"
    conc_raw = "enqueue one per transaction: 16 concurrent / raw single-row, 16 clients"
    claim = "claim cost: largest / smallest queue (median ms)"
    specs: list[tuple[str, float | None, str, Callable[[float], bool]]] = [
        (drain_peer, _ratio(pgqueue_drain, peer_drain), ">= 3", lambda v: v >= 3),
        (drain_raw, _ratio(default_batch, raw_100), ">= 0.40", lambda v: v >= 0.40),
        (seq_raw, _ratio(seq, raw_one), ">= 0.80", lambda v: v >= 0.80),
        (conc_raw, _ratio(conc, raw_many), ">= 0.80", lambda v: v >= 0.80),
        ("bulk enqueue / raw COPY", _ratio(bulk, raw_copy), ">= 0.50", lambda v: v >= 0.50),
        ("idle latency p50 (ms)", median(idle, "p50_ms"), "<= 2", lambda v: v <= 2),
        ("idle latency p99 (ms)", median(idle, "p99_ms"), "<= 5", lambda v: v <= 5),
        ("idle latency max (ms)", median(idle, "max_ms"), "<= 20", lambda v: v <= 20),
        (claim, claim_growth, "<= 1.5", lambda v: v <= 1.5),
    ]
    return [
        {
            "target": name,
            "measured": value,
            "goal": goal,
            "met": None if value is None else ok(value),
        }
        for name, value, goal, ok in specs
    ]


# -- tables ------------------------------------------------------------------------------------


def cell(row: dict[str, Any] | None, key: str, digits: int = 0) -> str:
    if row is None:
        return "-"
    if "failed" in row:
        return "failed (see below)"
    s = row["summary"].get(key)
    if s is None:
        return "-"
    if digits == 0:
        return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def _systems(results: dict[str, Any]) -> list[str]:
    names = ["pgqueue", *PEERS]
    return [n for n in names if n in results["config"]["systems"]]


def _unavailable(results: dict[str, Any], system: str) -> str | None:
    note: str | None = results["unavailable"].get(system)
    return note


def table(results: dict[str, Any]) -> str:
    runs = results["config"]["runs"]
    db = results["database"]
    lines = [
        f"PostgreSQL {db.get('server_version')}"
        f"{' (embedded)' if db.get('embedded') else ''}; fsync={db['settings'].get('fsync')}, "
        f"synchronous_commit={db['settings'].get('synchronous_commit')}, "
        f"shared_buffers={db['settings'].get('shared_buffers')}; "
        f"{results['host']['cpus']} cores, Python {results['host']['python']}. "
        f"Each cell: median (min-max) of {runs} run(s).",
        "",
    ]
    for title, render in (
        ("Drain: jobs/s, one worker process", _drain_table),
        ("Enqueue: jobs/s", _enqueue_table),
        ("Idle latency: enqueue commit -> handler start, ms", _idle_table),
        ("Steady state: producer at a fixed rate, one job per transaction", _steady_table),
        ("Claim cost as the queue grows: pgqueue's job_claim, batch 10, ms", _claim_table),
        ("Raw SQL bound: pgbench on pgqueue's jobs table, rows/s", _raw_table),
        ("Targets, ratios from this run", _targets_table),
        ("Where the gaps are: the same ratios against narrower bounds", _gaps_table),
        ("Rows that could not be measured", _failures),
    ):
        body = render(results)
        if body:
            lines += [f"### {title}", "", *body, ""]
    return "\n".join(lines)


def _peer_notes(results: dict[str, Any], columns: int) -> list[str]:
    notes = []
    for name in _systems(results):
        note = _unavailable(results, name)
        if note:
            notes.append(f"| {name} | " + " | ".join([note] + ["-"] * (columns - 1)) + " |")
    return notes


def _drain_table(results: dict[str, Any]) -> list[str]:
    if "drain" not in results["workloads"]:
        return []
    concs = [*results["config"]["concurrencies"], None]
    out = [
        "Each system's best setting per column, named in brackets (every setting's figures "
        "are in results.json). `no cap`: settings that set no limit on the jobs at once.",
        "",
        "| system | "
        + " | ".join("no cap" if c is None else f"concurrency {c}" for c in concs)
        + " |",
        "|---|" + "---|" * len(concs),
    ]
    for name in _systems(results):
        if _unavailable(results, name):
            continue
        found = [find(results, "drain", name, concurrency=c) for c in concs]
        cells = [cell(row, "jobs_per_s") + setting(row) if row else "-" for row in found]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += _peer_notes(results, len(concs))
    return [*out, "", *_settings_list(results, "drain")]


def _settings_list(results: dict[str, Any], section: str) -> list[str]:
    """Every setting each system ran at in `section`, with its median figure."""
    key, _ = RANKED_BY.get(section, ("jobs_per_s", max))
    out = []
    for row in rows(results, section):
        p = row["params"]
        if "setting" not in p:
            continue
        conc = "no cap" if p.get("concurrency") is None else f"concurrency {p['concurrency']}"
        figure = cell(row, key, 2 if key.endswith("_ms") else 0)
        out.append(f"- {row['system']}, {conc}, {p['setting']}: {figure}")
    return ["All settings:", "", *out] if out else []


def _enqueue_table(results: dict[str, Any]) -> list[str]:
    if "enqueue" not in results["workloads"]:
        return []
    c = results["config"]
    out = [
        f"| system | one per transaction, sequential | one per transaction, {c['clients']} "
        f"concurrent | bulk, {c['bulk_batch']} per transaction |",
        "|---|---|---|---|",
    ]
    for name in _systems(results):
        if _unavailable(results, name):
            continue
        cells = [
            cell(find(results, "enqueue", name, mode=m), "jobs_per_s")
            for m in ("sequential", "concurrent", "bulk")
        ]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    if "raw" in results["workloads"]:
        one = cell(find(results, "raw", workload="insert", clients=1), "jobs_per_s")
        many = cell(find(results, "raw", workload="insert", clients=c["clients"]), "jobs_per_s")
        copy = cell(find(results, "raw", workload="copy"), "jobs_per_s")
        out.append(f"| raw SQL (insert; COPY) | {one} | {many} | {copy} |")
    return out + _peer_notes(results, 3)


def _idle_table(results: dict[str, Any]) -> list[str]:
    if "idle" not in results["workloads"]:
        return []
    out = ["| system | p50 | p95 | p99 | max |", "|---|---|---|---|---|"]
    for name in _systems(results):
        if _unavailable(results, name):
            continue
        row = find(results, "idle", name)
        cells = [cell(row, k, 2) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
        out.append(f"| {name}{setting(row)} | " + " | ".join(cells) + " |")
    return out + _peer_notes(results, 4) + ["", *_settings_list(results, "idle")]


def _steady_table(results: dict[str, Any]) -> list[str]:
    if "steady" not in results["workloads"]:
        return []
    c = results["config"]
    out = [
        f"Producer target {c['rate']:g} jobs/s for {c['steady_seconds']:g} s; latency in ms.",
        "",
        "| system | produced/s | completed/s | p50 | p95 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in _systems(results):
        if _unavailable(results, name):
            continue
        row = find(results, "steady", name)
        cells = [cell(row, "produced_per_s"), cell(row, "completed_per_s")]
        cells += [cell(row, k, 2) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
        out.append(f"| {name}{setting(row)} | " + " | ".join(cells) + " |")
    return out + _peer_notes(results, 6) + ["", *_settings_list(results, "steady")]


def _claim_table(results: dict[str, Any]) -> list[str]:
    if "claim" not in results["workloads"]:
        return []
    out = ["| queued | median | p95 | max |", "|---|---|---|---|"]
    for row in rows(results, "claim"):
        cells = [cell(row, k, 3) for k in ("median_ms", "p95_ms", "max_ms")]
        out.append(f"| {row['params']['queued']:,} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("procrastinate and PgQueuer: not measured (their claim statements are not")
    out.append("exposed as one statement to time; their drain rows show their claim paths).")
    return out


def _raw_table(results: dict[str, Any]) -> list[str]:
    raw = results["workloads"].get("raw")
    if raw is None:
        return []
    if "unavailable" in raw:
        return [raw["unavailable"]]
    out = ["| workload | clients | rows/s |", "|---|---|---|"]
    for row in rows(results, "raw"):
        p = row["params"]
        what = {
            "claim_delete": f"claim-and-delete, batch {p.get('batch')}",
            "insert": "single-row INSERT per transaction",
            "insert_notify": "single-row INSERT + pg_notify per transaction",
            "insert_many": f"multi-row INSERT, {p.get('batch')} per transaction",
            "copy": f"COPY (psycopg), {p.get('batch')} per transaction",
            "lease_finish": f"pgqueue's lifecycle in SQL (lease, then finish into history), "
            f"batch {p.get('batch')}",
            "psycopg_insert": "single-row INSERT per transaction, sent from psycopg",
            "psycopg_lifecycle": f"pgqueue's lifecycle in SQL from psycopg, a no-op coroutine "
            f"per job, batch {p.get('batch')}, {SHAPES.get(p.get('shape', ''), '')}",
        }[p["workload"]]
        clients = 2 if p.get("shape") in ("two", "apart") else p.get("clients", 1)
        out.append(f"| {what} | {clients} | {cell(row, 'jobs_per_s')} |")
    return out


def _failures(results: dict[str, Any]) -> list[str]:
    out = []
    for workload, found in results["workloads"].items():
        for row in found.get("rows", []):
            if "failed" in row:
                params = ", ".join(f"{k}={v}" for k, v in row["params"].items())
                out.append(f"- {workload}, {row['system']} ({params}): {row['failed']}")
    return out


def _targets_table(results: dict[str, Any]) -> list[str]:
    out = ["| target | measured | goal | met |", "|---|---|---|---|"]
    for t in results["targets"]:
        value = "not measured" if t["measured"] is None else f"{t['measured']:.2f}"
        met = {True: "yes", False: "**no**", None: "-"}[t["met"]]
        out.append(f"| {t['target']} | {value} | {t['goal']} | {met} |")
    return out


def gaps(results: dict[str, Any]) -> list[tuple[str, float | None]]:
    """Ratios that split each enqueue and drain target's gap into what Python and psycopg
    cost (psycopg_insert against pgbench) and what pgqueue adds (pgqueue against
    psycopg_insert), and the drain's into what the job lifecycle costs the server
    (lease_finish against claim-and-delete) and what the worker adds."""
    rate = "jobs_per_s"
    clients = results["config"]["clients"]
    drain = median(find(results, "drain", "pgqueue", concurrency=100), rate)
    lifecycle = best([median(r, rate) for r in raw_rows(results, "lease_finish", batch=100)])
    python = best([median(r, rate) for r in raw_rows(results, "psycopg_lifecycle", batch=100)])
    raw_100 = best([median(r, rate) for r in raw_rows(results, "claim_delete", batch=100)])
    floor_one = median(find(results, "raw", workload="psycopg_insert", clients=1), rate)
    floor_many = median(find(results, "raw", workload="psycopg_insert", clients=clients), rate)
    bench_one = median(find(results, "raw", workload="insert", clients=1), rate)
    bench_many = median(find(results, "raw", workload="insert", clients=clients), rate)
    seq = median(find(results, "enqueue", "pgqueue", mode="sequential"), rate)
    conc = median(find(results, "enqueue", "pgqueue", mode="concurrent"), rate)
    return [
        ("pgqueue's lifecycle in SQL / raw claim-and-delete, batch 100",
         _ratio(lifecycle, raw_100)),
        ("drain at batch 100 / pgqueue's lifecycle in SQL, batch 100", _ratio(drain, lifecycle)),
        ("pgqueue's lifecycle in SQL from psycopg / from pgbench, batch 100",
         _ratio(python, lifecycle)),
        ("drain at batch 100 / pgqueue's lifecycle in SQL from psycopg, batch 100",
         _ratio(drain, python)),
        ("psycopg single-row INSERT / pgbench, sequential", _ratio(floor_one, bench_one)),
        ("enqueue sequential / psycopg single-row INSERT", _ratio(seq, floor_one)),
        (f"psycopg single-row INSERT / pgbench, {clients} clients",
         _ratio(floor_many, bench_many)),
        (f"enqueue {clients} concurrent / psycopg single-row INSERT, {clients} clients",
         _ratio(conc, floor_many)),
    ]  # fmt: skip


def _gaps_table(results: dict[str, Any]) -> list[str]:
    found = gaps(results)
    if all(value is None for _, value in found):
        return []
    out = ["| ratio | measured |", "|---|---|"]
    for name, value in found:
        out.append(f"| {name} | {'not measured' if value is None else f'{value:.2f}'} |")
    return out


# -- files -------------------------------------------------------------------------------------


def write_json(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def write(out: Path, results: dict[str, Any]) -> None:
    write_json(out, results)
    (out / "results.md").write_text(table(results) + "\n")
    charts(out, results)


def charts(out: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    db = results["database"]
    where = f"PostgreSQL {db.get('server_version')}, {results['host']['cpus']} cores"
    _bars(plt, out / "drain.png", results, "drain", "concurrency", "jobs_per_s",
          f"Drain: jobs/s, one worker process ({where})", raw_key="claim_delete")  # fmt: skip
    _bars(plt, out / "enqueue.png", results, "enqueue", "mode", "jobs_per_s",
          f"Enqueue: jobs/s ({where})")  # fmt: skip
    _latency_chart(plt, out / "latency.png", results, where)
    _claim_chart(plt, out / "claim_cost.png", results, where)


def _bars(
    plt: Any,
    path: Path,
    results: dict[str, Any],
    workload: str,
    by: str,
    key: str,
    title: str,
    raw_key: str | None = None,
) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    groups: list[Any] = []
    for row in rows(results, workload):
        if row["params"][by] not in groups:
            groups.append(row["params"][by])
    systems = [s for s in _systems(results) if find(results, workload, s)]
    width = 0.8 / max(1, len(systems))
    for i, name in enumerate(systems):
        values = [median(find(results, workload, name, **{by: g}), key) or 0 for g in groups]
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    if raw_key is not None:
        for batch, style in ((1, ":"), (10, "--"), (100, "-")):
            bound = best([median(r, key) for r in raw_rows(results, raw_key, batch=batch)])
            if bound:
                ax.axhline(bound, color="grey", linestyle=style, label=f"raw SQL, batch {batch}")
        for batch, style in ((10, "--"), (100, "-")):
            found = raw_rows(results, "lease_finish", batch=batch)
            bound = best([median(r, key) for r in found])
            if bound:
                label = f"pgqueue's lifecycle in SQL, batch {batch}"
                ax.axhline(bound, color="tab:purple", linestyle=style, label=label)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(["no cap" if g is None else f"{by} {g}" for g in groups])
    ax.set_yscale("log")
    ax.set_ylabel("jobs/s (median, log scale)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_chart(plt: Any, path: Path, results: dict[str, Any], where: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = ("p50_ms", "p99_ms", "max_ms")
    systems = [s for s in _systems(results) if find(results, "idle", s)]
    for i, key in enumerate(keys):
        values = [median(find(results, "idle", s), key) or 0 for s in systems]
        ax.bar([x + i * 0.27 for x in range(len(systems))], values, 0.27, label=key[:-3])
    ax.set_xticks([x + 0.27 for x in range(len(systems))])
    ax.set_xticklabels(systems)
    ax.set_ylabel("ms from enqueue commit to handler start")
    ax.set_title(f"Idle latency (median of runs; {where})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _claim_chart(plt: Any, path: Path, results: dict[str, Any], where: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    measured = [r for r in rows(results, "claim") if "summary" in r]
    sizes = [r["params"]["queued"] for r in measured]
    for key in ("median_ms", "p95_ms"):
        ax.plot(sizes, [median(r, key) for r in measured], marker="o", label=key[:-3])
    ax.set_xscale("log")
    ax.set_xlabel("jobs queued")
    ax.set_ylabel("ms per claim of 10")
    ax.set_ylim(bottom=0)
    ax.set_title(f"pgqueue claim cost as the queue grows ({where})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def raw_bound(results: dict[str, Any], workload: str, **params: Any) -> float | None:
    """The best jobs/s of one raw-bound workload's rows matching `params`."""
    return best([median(r, "jobs_per_s") for r in raw_rows(results, workload, **params)])


def fastest_peer(results: dict[str, Any], section: str, **params: Any) -> dict[str, Any] | None:
    """The row of the peer whose best setting did best at this workload."""
    key, pick = RANKED_BY.get(section, ("jobs_per_s", max))
    found = [
        row
        for name in PEERS
        if not _unavailable(results, name)
        and (row := find(results, section, name, **params)) is not None
        and median(row, key) is not None
    ]
    return pick(found, key=lambda row: median(row, key) or 0.0) if found else None


def readme_table(results: dict[str, Any]) -> str:
    """The README's "Performance" table, in ratios only (a shared machine's jobs/s move from
    day to day; what one run measured side by side does not): pgqueue over the fastest peer
    at its best setting (named), and over the bound measured in the same run. Drains are set
    against the peers held to the same number of jobs at once and against those with no cap,
    whichever way that goes."""
    rate = "jobs_per_s"
    lines = [
        "| workload | pgqueue / the fastest peer at its best "
        "| pgqueue / its bound in the same run |",
        "|---|---|---|",
    ]

    def ratio(ours: float | None, theirs: float | None, times: str = "x") -> str:
        value = _ratio(ours, theirs)
        return "-" if value is None else f"{value:.2f}{times}"

    def raw(workload: str, **params: Any) -> float | None:
        return raw_bound(results, workload, **params)

    def peer(section: str, **params: Any) -> dict[str, Any] | None:
        return fastest_peer(results, section, **params)

    def against(ours: float | None, row: dict[str, Any] | None) -> str:
        if row is None:
            return "-"
        return f"{ratio(ours, median(row, rate))} {TITLES[row['system']]}{setting(row)}"

    uncapped = peer("drain", concurrency=None)
    for n in (10, 100):
        ours = median(find(results, "drain", "pgqueue", concurrency=n), rate)
        capped = against(ours, peer("drain", concurrency=n))
        free = against(ours, uncapped)
        bound = ratio(ours, raw("lease_finish", batch=n), "")
        python = ratio(ours, raw("psycopg_lifecycle", batch=n), "")
        lines.append(
            f"| drain, one worker, at most {n} at once | {capped}; with no cap: {free} | "
            f"{bound} of its lifecycle as bare SQL (pgbench, batch {n}); {python} of the same "
            f"SQL sent from psycopg |"
        )
    clients = results["config"]["clients"]
    enqueues: list[tuple[str, dict[str, Any], float | None, str]] = [
        ("enqueue, one per transaction", {"mode": "sequential"},
         raw("insert", clients=1), "a bare INSERT (pgbench)"),
        (f"enqueue, one per transaction, {clients} connections", {"mode": "concurrent"},
         raw("insert", clients=clients), f"a bare INSERT (pgbench, {clients} clients)"),
        (f"enqueue, bulk ({results['config']['bulk_batch']:,} per transaction)", {"mode": "bulk"},
         raw("copy"), "COPY (from psycopg)"),
    ]  # fmt: skip
    for label, params, bound_rate, bound in enqueues:
        ours = median(find(results, "enqueue", "pgqueue", **params), rate)
        theirs = against(ours, peer("enqueue", **params))
        lines.append(f"| {label} | {theirs} | {ratio(ours, bound_rate, '')} of {bound} |")

    ours_idle = find(results, "idle", "pgqueue")
    theirs_idle = peer("idle")
    figures = [
        ratio(median(ours_idle, key), median(theirs_idle, key)) for key in ("p50_ms", "p99_ms")
    ]
    name = "-" if theirs_idle is None else f"{TITLES[theirs_idle['system']]}{setting(theirs_idle)}"
    lines.append(
        "| idle latency p50 / p99, commit to handler start (lower is better) | "
        f"{' / '.join(figures)} {name} | |"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`python -m bench.throughput.report DIR`: redraw results.md and the charts of a run
    from its results.json (nothing is measured again). With `--readme`, print the README's
    "Performance" table instead."""
    readme = "--readme" in argv
    argv = [a for a in argv if a != "--readme"]
    if len(argv) != 1 or not (Path(argv[0]) / "results.json").is_file():
        print("usage: python -m bench.throughput.report [--readme] DIR (holding results.json)")
        return 2
    out = Path(argv[0])
    results = json.loads((out / "results.json").read_text())
    if readme:
        print(readme_table(results))
        return 0
    write(out, results)
    print(table(results))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
