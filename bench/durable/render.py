"""The durable bench's results.md: the run's header, then one table per part."""

from __future__ import annotations

from typing import Any

AIMS = {
    "checkpoints": "a step adds under 1 ms at p50",
    "chains": "the durable job at least as fast as the chain (ratio >= 1)",
    "parked": "claims and drains within 10% with the parked jobs (ratios 0.9-1.1)",
    "wake": "2 ms p50, 10 ms p99 from the finish's commit",
}


def markdown(results: dict[str, Any]) -> str:
    db = results["database"]
    lines = [
        "# durable",
        "",
        f"- command: `{results['command']}`",
        f"- started {results['started_at']}, PostgreSQL {db['server_version']}"
        f"{' (embedded)' if db['embedded'] else ''}",
        "- settings: " + ", ".join(f"{k}={v}" for k, v in db["settings"].items()),
        f"- host: {results['host']['cpus']} cpus, Python {results['host']['python']}",
        "- config: " + ", ".join(f"{k}={v}" for k, v in results["config"].items()),
    ]
    parts = results["parts"]
    for name, render in (
        ("checkpoints", _checkpoints),
        ("chains", _chains),
        ("parked", _parked),
        ("wake", _wake),
    ):
        if name in parts:
            lines += ["", f"## {name}", "", f"Aim: {AIMS[name]}.", "", *render(parts[name])]
    return "\n".join(lines) + "\n"


def _checkpoints(found: dict[str, Any]) -> list[str]:
    rows = [
        "| task, work | rounds | bare p50 ms | bare p99 ms | step p50 ms | step p99 ms "
        "| added p50 ms | added p99 ms | step/bare p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, f in found.items():
        # Over a no-op, the ratio says nothing: the step is all there is.
        ratio = "-" if name.endswith("noop") else f"{f['ratio_p50']:.2f}"
        rows.append(
            f"| {name} | {f['rounds']} | {f['bare_ms_p50']:.3f} | {f['bare_ms_p99']:.3f} "
            f"| {f['step_ms_p50']:.3f} | {f['step_ms_p99']:.3f} | {f['added_ms_p50']:.3f} "
            f"| {f['added_ms_p99']:.3f} | {ratio} |"
        )
    rows += [
        "",
        "added: each round's step time minus its bare time, timed in the handler. An atomic "
        "task's bare INSERT waits for the job's one commit; its step commits it.",
    ]
    return rows


def _chains(found: dict[str, Any]) -> list[str]:
    rows = [
        "| work, worker concurrency | durable jobs/s | chains/s | ratio "
        "| durable end to end/s | chains end to end/s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for work, f in found.items():
        d, c = f["durable"], f["chain"]
        rows.append(
            f"| {work} | {d['per_s']:.1f} | {c['per_s']:.1f} | {f['ratio_per_s']:.2f} "
            f"| {d['end_to_end_per_s']:.1f} | {c['end_to_end_per_s']:.1f} "
            f"| {f['ratio_end_to_end_per_s']:.2f} |"
        )
    rows += [
        "",
        "A job: one durable job of ten steps, or one chain of ten jobs. jobs/s: drained by the "
        "burst worker; end to end: enqueue (one per transaction) and drain. Medians of the "
        "rounds.",
    ]
    return rows


def _parked(found: dict[str, Any]) -> list[str]:
    kinds = found["parked_jobs"]
    p, q = found["plain"], found["parked"]
    return [
        f"{kinds['sleeping']:,} sleeping and {kinds['waiting_for_signal']:,} signal-waiting "
        f"jobs, {found['setup']}.",
        "",
        "| | plain | with parked | ratio |",
        "|---|---:|---:|---:|",
        f"| claim p50 ms | {p['claim_ms_p50']:.3f} | {q['claim_ms_p50']:.3f} "
        f"| {found['claim_ratio']:.2f} |",
        f"| claim p95 ms | {p['claim_ms_p95']:.3f} | {q['claim_ms_p95']:.3f} | |",
        f"| drain jobs/s | {p['drain_per_s']:.0f} | {q['drain_per_s']:.0f} "
        f"| {found['drain_ratio']:.2f} |",
    ]


def _wake(found: dict[str, Any]) -> list[str]:
    rows = [
        "| measured from | jobs | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, f in (
        ("the finish's commit (finisher)", found["commit"]["from_commit"]),
        ("the finish statement sent (finisher)", found["commit"]["from_statement_sent"]),
        ("the handler's return (worker)", found["worker"]["from_handler_return"]),
    ):
        rows.append(
            f"| {label} | {f['jobs']} | {f['p50_ms']:.2f} | {f['p99_ms']:.2f} | {f['max_ms']:.2f} |"
        )
    rows += [
        "",
        f"{found['waiters']:,} waits in one process, one shared listening connection. The "
        f"finisher finishes one job per transaction, {found['commit']['gap_s'] * 1000:g} ms "
        "apart; the worker runs at concurrency "
        f"{found['worker']['concurrency']}, its completer batching finishes.",
    ]
    return rows
