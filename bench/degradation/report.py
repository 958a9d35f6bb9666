"""The files of the degradation bench: samples.csv, summary.json, the charts and the table.

Owns: turning Sample rows into the per-run summary (runaway, end-of-run claim time, its ratio
to the same strategy's control run) and into pictures. Reads nothing from the database.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.degradation.sampler import COLUMNS, Sample

END_FRACTION = 0.2  # "at the end": the last 20% of the run
STRATEGY_COLORS = {"plain": "tab:red", "hint": "tab:orange", "default": "tab:blue"}
MODE_STYLES = {"control": "--", "hold": "-"}
CHARTS = {
    "depth.png": ("depth", "queue depth (queued jobs)", False),
    "claim_p50.png": ("claim_p50_ms", "claim time p50 (ms)", True),
    "dead_tuples.png": ("n_dead_tup", "n_dead_tup of jobs", False),
    "floor_claim.png": ("floor_claim_ms", "the workers' unhinted (floor) claims, p50 (ms)", True),
    "floor_probe.png": ("probe_floor_ms", "unhinted (floor) claim probe (ms)", True),
}


def append_samples(path: Path, samples: Sequence[Sample]) -> None:
    """Append rows to samples.csv, writing the header first if the file is new."""
    new = not path.exists()
    with path.open("a", newline="") as out:
        writer = csv.writer(out)
        if new:
            writer.writerow(COLUMNS)
        for sample in samples:
            writer.writerow([_cell(getattr(sample, name)) for name in COLUMNS])


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return round(value, 3)
    return value


def summarise_run(
    samples: Sequence[Sample], *, rate: float, runaway_seconds: float, duration: float
) -> dict[str, Any]:
    """One run's figures. A run ran away when depth exceeded `runaway_seconds` of input."""
    threshold = rate * runaway_seconds
    runaway = next((s for s in samples if s.depth > threshold), None)
    end = [s for s in samples if s.t_s >= (1 - END_FRACTION) * duration] or list(samples[-1:])
    last = samples[-1] if samples else None
    return {
        "strategy": samples[0].strategy if samples else None,
        "mode": samples[0].mode if samples else None,
        "samples": len(samples),
        "ran_away": runaway is not None,
        "runaway_at_s": runaway.t_s if runaway else None,
        "max_depth": max((s.depth for s in samples), default=None),
        "end_depth": last.depth if last else None,
        "claim_source": last.claim_source if last else None,
        "claim_p50_end_ms": _median(end, lambda s: s.claim_p50_ms),
        "claim_p99_end_ms": _median(end, lambda s: s.claim_p99_ms),
        "claim_p50_run_ms": _median(samples, lambda s: s.claim_p50_ms),
        "claim_p50_minutes_ms": [
            _median([s for s in samples if m <= s.t_s < m + 60], lambda s: s.claim_p50_ms)
            for m in range(0, max(1, math.ceil(duration)), 60)
        ],
        "probe_hint_end_ms": _median(end, lambda s: s.probe_hint_ms),
        "probe_floor_end_ms": _median(end, lambda s: s.probe_floor_ms),
        "floor_claim_end_ms": _median(end, lambda s: s.floor_claim_ms),
        "floor_claim_max_ms": max((s.floor_claim_ms or 0.0 for s in samples), default=None),
        "produced_per_s_end": _mean(end, lambda s: s.produced_per_s),
        "claims_per_s_end": _mean(end, lambda s: s.claims_per_s),
        "completions_per_s_end": _mean(end, lambda s: s.completions_per_s),
        "floor_claims_per_s_end": _mean(end, lambda s: s.floor_claims_per_s),
        "floor_claim_load_end": _floor_load(end),
        "n_dead_tup_max": max((s.n_dead_tup or 0 for s in samples), default=None),
        "oldest_xact_max_s": max((s.oldest_xact_s or 0.0 for s in samples), default=None),
        "sample_ms_max": round(max((s.sample_ms for s in samples), default=0.0), 1),
        "depth_count_gap_max": max(
            (abs(s.depth - s.depth_counted) for s in samples if s.depth_counted is not None),
            default=None,
        ),
    }


def _floor_load(rows: Sequence[Sample]) -> float | None:
    """Seconds per second the workers spend in unhinted claims: their rate times the median of
    the workers' own unhinted claim times that second (0 in seconds without any)."""
    loads = [s.floor_claims_per_s * (s.floor_claim_ms or 0.0) / 1000 for s in rows]
    return round(statistics.fmean(loads), 3) if loads else None


def _median(rows: Sequence[Sample], get: Callable[[Sample], float | None]) -> float | None:
    values = [v for v in map(get, rows) if v is not None]
    return round(statistics.median(values), 4) if values else None


def _mean(rows: Sequence[Sample], get: Callable[[Sample], float | None]) -> float | None:
    values = [v for v in map(get, rows) if v is not None]
    return round(statistics.fmean(values), 1) if values else None


def by_strategy(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Runs grouped per strategy, with the hold run's end claim time over its control's."""
    grouped: dict[str, dict[str, Any]] = {}
    for run in runs:
        grouped.setdefault(run["strategy"], {})[run["mode"]] = run
    for modes in grouped.values():
        control, hold = modes.get("control"), modes.get("hold")
        for key in ("claim_p50_end_ms", "probe_floor_end_ms"):
            ratio = None
            if control and hold and control[key] and hold[key] is not None:
                ratio = round(hold[key] / control[key], 2)
            modes[key.replace("_end_ms", "_ratio_hold_to_control")] = ratio
        # "For the whole run": the worst minute of the hold run against the control run.
        worst = None
        if control and hold and control["claim_p50_run_ms"]:
            minutes = [m for m in hold["claim_p50_minutes_ms"] if m is not None]
            if minutes:
                worst = round(max(minutes) / control["claim_p50_run_ms"], 2)
        modes["claim_p50_worst_minute_ratio_hold_to_control"] = worst
    return grouped


def table(summary: dict[str, Any]) -> str:
    """The summary as a fixed-width table for stdout."""
    header = (
        f"{'strategy':<8} {'mode':<7} {'ran away':>9} {'max depth':>9} {'end depth':>9} "
        f"{'claims/s':>8} {'done/s':>8} {'claim p50 ms':>14} {'x control':>9} "
        f"{'worst min':>9} {'floor ms':>9} {'floor s/s':>9} {'dead tuples':>11}"
    )
    lines = [header, "-" * len(header)]
    for strategy, modes in summary["strategies"].items():
        for mode in ("control", "hold"):
            run = modes.get(mode)
            if run is None:
                continue
            ratio = modes["claim_p50_ratio_hold_to_control"] if mode == "hold" else None
            worst = (
                modes["claim_p50_worst_minute_ratio_hold_to_control"] if mode == "hold" else None
            )
            away = f"at {run['runaway_at_s']:.0f}s" if run["ran_away"] else "no"
            p50 = _fmt(run["claim_p50_end_ms"], ".3f") + f" {run['claim_source'][0]}"
            lines.append(
                f"{strategy:<8} {mode:<7} {away:>9} {run['max_depth']:>9} {run['end_depth']:>9} "
                f"{_fmt(run['claims_per_s_end'], '.0f'):>8} "
                f"{_fmt(run['completions_per_s_end'], '.0f'):>8} {p50:>14} "
                f"{_fmt(ratio, '.2f'):>9} {_fmt(worst, '.2f'):>9} "
                f"{_fmt(run['floor_claim_end_ms'], '.3f'):>9} "
                f"{_fmt(run['floor_claim_load_end'], '.3f'):>9} {run['n_dead_tup_max']:>11}"
            )
    lines.append(
        "claims/s, done/s, claim p50, floor ms (the workers' unhinted claims, p50) and floor s/s "
        "(unhinted claims/s x their time): the last 20% of each run. worst min: the hold run's "
        "slowest minute (median of its per-second claim p50) over the control run's median.\n"
        "claim p50: c = timed around each claim statement by the claim loop, w = by pgqueue's "
        "Worker itself (stats.recent_claims). dead tuples: max."
    )
    beside = [
        f"{summary[key]:,} {what}"
        for key, what in (
            ("waiting_jobs", "blocked workflow jobs"),
            ("sleeping_jobs", "jobs parked by durable sleeps and signal waits"),
        )
        if summary.get(key)
    ]
    if beside:
        lines.append(f"In the jobs table throughout each run: {' and '.join(beside)}.")
    if summary.get("fairness_keys"):
        lines.append(
            f"Every job enqueued with a fairness key, round-robin over "
            f"{summary['fairness_keys']:,} keys: the default strategy's workers claim them "
            "with the fair claim."
        )
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def charts(
    out_dir: Path, samples: Sequence[Sample], title: str, runaway_depth: float
) -> list[Path]:
    """One PNG per CHARTS entry: strategies overlaid, control dashed, hold solid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[tuple[str, str], list[Sample]] = {}
    for sample in samples:
        runs.setdefault((sample.strategy, sample.mode), []).append(sample)
    written = []
    for filename, (column, label, log) in CHARTS.items():
        fig, ax = plt.subplots(figsize=(9, 5))
        for (strategy, mode), rows in runs.items():
            points = [(s.t_s, getattr(s, column)) for s in rows if getattr(s, column) is not None]
            if log:
                points = [(t, v) for t, v in points if v > 0]
            if not points:
                continue
            ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                MODE_STYLES.get(mode, "-"),
                color=STRATEGY_COLORS.get(strategy),
                label=f"{strategy} {mode}",
                linewidth=1.4,
            )
        if column == "depth":
            ax.axhline(runaway_depth, color="grey", linestyle=":", linewidth=1, label="runaway")
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("time since the producer started (s)")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
