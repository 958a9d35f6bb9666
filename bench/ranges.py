"""The ratios the README and docs quote, over runs on different days: each day's figure and
the range.

    python -m bench.ranges [--git FOLDER ...] [--since REV] [RESULTS.json ...]

A shared machine's rates move from day to day, and ratios measured side by side in one run
move less but still move; a figure worth quoting is one that held on every day it was
measured. This reads `throughput` and `steady` results (files, or with `--git` every committed
version of FOLDER/results.json, from commit `--since` on), computes each ratio as the suite's
own report does (bench/throughput/report.py, bench/steady/tables.py), and prints, per ratio,
the figure of the last run of each day that ran what the ratio needs (the day is the run's
`started_at`, UTC) and the range over those days. A ratio measured on fewer than three days
is marked. Nothing is measured again.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.steady import tables
from bench.steady.suite import PEERS as STEADY_PEERS
from bench.throughput import report

ROOT = Path(__file__).resolve().parent.parent
RATE = "jobs_per_s"
DAYS_NEEDED = 3


@dataclass(frozen=True)
class Run:
    """One results file: where it was read from, and its contents."""

    source: str
    results: dict[str, Any]

    @property
    def suite(self) -> str:
        found: str = self.results["bench"]
        return found

    @property
    def started(self) -> str:
        found: str = self.results["started_at"]
        return found

    @property
    def day(self) -> str:
        return self.started[:10]


# A ratio's figure in one run: its values (one, or one per point of a span of rates) and
# what pgqueue was set against there. None: the run did not run what the ratio needs.
Figure = tuple[list[float], str]
Measure = Callable[[dict[str, Any]], Figure | None]


@dataclass(frozen=True)
class Ratio:
    label: str
    suite: str
    measure: Measure


# -- the throughput suite's ratios, as bench/throughput/report.py computes them -------------


def _peer_name(row: dict[str, Any]) -> str:
    return report.TITLES[row["system"]] + report.setting(row)


def _against_peer(section: str, key: str = RATE, mine: Any = None, **theirs: Any) -> Measure:
    """pgqueue's figure at `mine` (else `theirs`) over the fastest peer's at `theirs`."""

    def measure(results: dict[str, Any]) -> Figure | None:
        row = report.fastest_peer(results, section, **theirs)
        ours = report.find(results, section, "pgqueue", **(theirs if mine is None else mine))
        value = report._ratio(report.median(ours, key), report.median(row, key))
        return None if row is None or value is None else ([value], _peer_name(row))

    return measure


def _against_bound(section: str, mine: dict[str, Any], workload: str, **params: Any) -> Measure:
    def measure(results: dict[str, Any]) -> Figure | None:
        ours = report.median(report.find(results, section, "pgqueue", **mine), RATE)
        value = report._ratio(ours, report.raw_bound(results, workload, **params))
        return None if value is None else ([value], "")

    return measure


def _named(
    compute: Callable[[dict[str, Any]], list[tuple[str, float | None]]], name: str
) -> Measure:
    """One of the report's named ratios (its targets or its gaps)."""

    def measure(results: dict[str, Any]) -> Figure | None:
        value = dict(compute(results)).get(name)
        return None if value is None else ([value], "")

    return measure


def _targets(results: dict[str, Any]) -> list[tuple[str, float | None]]:
    return [(t["target"], t["measured"]) for t in report.targets(results)]


def _throughput() -> list[Ratio]:
    found = []
    for n in (10, 100):
        drain = f"drain, at most {n} at once"
        found += [
            Ratio(f"{drain} / the fastest peer at {n}", "throughput",
                  _against_peer("drain", concurrency=n)),
            Ratio(f"{drain} / the fastest peer with no cap", "throughput",
                  _against_peer("drain", mine={"concurrency": n}, concurrency=None)),
            Ratio(f"{drain} / its lifecycle as bare SQL (pgbench, batch {n})", "throughput",
                  _against_bound("drain", {"concurrency": n}, "lease_finish", batch=n)),
            Ratio(f"{drain} / the same SQL from psycopg (batch {n})", "throughput",
                  _against_bound("drain", {"concurrency": n}, "psycopg_lifecycle", batch=n)),
        ]  # fmt: skip
    gaps = report.gaps
    found += [
        Ratio("drain, at most 100 at once / raw claim-and-delete (batch 100)", "throughput",
              _named(_targets, "drain: pgqueue at batch 100 / raw claim-and-delete at batch 100")),
        Ratio("enqueue, one per transaction / the fastest peer", "throughput",
              _against_peer("enqueue", mode="sequential")),
        Ratio("enqueue, one per transaction / a bare INSERT (pgbench)", "throughput",
              _named(_targets, "enqueue one per transaction: sequential / raw single-row")),
        Ratio("enqueue, one per transaction / the same INSERT from psycopg", "throughput",
              _named(gaps, "enqueue sequential / psycopg single-row INSERT")),
        Ratio("enqueue, 16 connections / the fastest peer", "throughput",
              _against_peer("enqueue", mode="concurrent")),
        Ratio("enqueue, 16 connections / a bare INSERT (pgbench, 16 clients)", "throughput",
              _named(_targets, "enqueue one per transaction: 16 concurrent / raw single-row, "
                     "16 clients")),
        Ratio("enqueue, 16 connections / the same INSERT from psycopg", "throughput",
              _named(gaps, "enqueue 16 concurrent / psycopg single-row INSERT, 16 clients")),
        Ratio("enqueue, bulk (1,000 per transaction) / the fastest peer", "throughput",
              _against_peer("enqueue", mode="bulk")),
        Ratio("enqueue, bulk / COPY (from psycopg)", "throughput",
              _named(_targets, "bulk enqueue / raw COPY")),
        Ratio("idle latency p50 / the peer with the lowest p50 (lower is better)", "throughput",
              _against_peer("idle", key="p50_ms")),
        Ratio("idle latency p99 / the same peer (lower is better)", "throughput",
              _against_peer("idle", key="p99_ms")),
        Ratio("claim time, 1M queued / 1k queued (lower is better)", "throughput",
              _named(_targets, "claim cost: largest / smallest queue (median ms)")),
    ]  # fmt: skip
    return found


# -- the steady suite's ratios, as bench/steady/tables.py computes them ----------------------


def _steady(
    key: str, producers: int, rates: Sequence[float], peers: Sequence[str], needs: Sequence[str]
) -> Measure:
    """`key` of tables.ratios at each of `rates` from `producers` connections, in a run that
    ran every system in `needs` at those points. A point without the ratio (pgqueue skipped
    it after falling behind) still makes that run the day's, marked: no earlier run of the
    same day stands in for it."""

    def measure(results: dict[str, Any]) -> Figure | None:
        config, systems = results["config"], results["systems"]
        ran = producers in config["producers"] and all(r in config["rates"] for r in rates)
        if not ran or not all(name in systems for name in ("pgqueue", *needs)):
            return None
        at = {
            r["rate"]: r[key]
            for r in tables.ratios(systems, peers)
            if r["producers"] == producers and r.get(key) is not None
        }
        values = [at[r] for r in rates if r in at]
        return values, "" if len(values) == len(rates) else "not all measured"

    return measure


def _steady_ratios() -> list[Ratio]:
    pgqueuer, everyone = ("pgqueuer",), STEADY_PEERS
    below, top = (200.0, 500.0, 1000.0, 2000.0), (4000.0,)
    found = []
    for n in (16, 64, 1):
        finished = f"jobs finished, {n} connection{'s' if n > 1 else ''}, 4,000 offered"
        found += [
            Ratio(f"{finished} / the best of the four peers", "steady",
                  _steady("finished_vs_best_peer", n, top, everyone, everyone)),
            Ratio(f"{finished} / PgQueuer", "steady",
                  _steady("finished_vs_best_peer", n, top, pgqueuer, pgqueuer)),
        ]  # fmt: skip
    found += [
        Ratio("jobs finished, 16 connections, 4,000 offered / the pgbench bound", "steady",
              _steady("finished_vs_bound", 16, top, (), ("bound",))),
        Ratio("CPU per job, 16 connections, 200-4,000 / the best of the four peers "
              "(lower is better)", "steady",
              _steady("cpu_vs_best_peer", 16, (*below, *top), everyone, everyone)),
    ]  # fmt: skip
    for n in (16, 64):
        bare = ("bound_python",)
        found += [
            Ratio(f"jobs finished, {n} connections, 4,000 offered / the bare asyncio worker",
                  "steady", _steady("finished_vs_bound_python", n, top, (), bare)),
            Ratio(f"p99, {n} connections, 200-2,000 / the bare asyncio worker's "
                  "(lower is better)", "steady",
                  _steady("p99_vs_bound_python", n, below, (), bare)),
            Ratio(f"p99, {n} connections, 4,000 / the bare asyncio worker's (lower is better)",
                  "steady", _steady("p99_vs_bound_python", n, top, (), bare)),
            Ratio(f"CPU per job, {n} connections, 200-2,000 / the bare asyncio worker's "
                  "(lower is better)", "steady",
                  _steady("cpu_vs_bound_python", n, below, (), bare)),
        ]  # fmt: skip
    return found


RATIOS = [*_throughput(), *_steady_ratios()]


# -- reading runs --------------------------------------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout


def committed(folder: str, since: str | None) -> list[Run]:
    """Every committed version of `folder`/results.json (a path from the repository's top),
    from commit `since` on."""
    path = f"{folder.rstrip('/')}/results.json"
    commits = _git("log", "--format=%H", "--", path).split()
    if since is not None:
        commits = [c for c in commits if _descends(c, since)]
    return [Run(f"{c[:7]}:{folder}", json.loads(_git("show", f"{c}:{path}"))) for c in commits]


def _descends(commit: str, since: str) -> bool:
    return (
        subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", since, commit],
            capture_output=True,
        ).returncode
        == 0
    )


def per_day(runs: Sequence[Run], ratio: Ratio) -> dict[str, tuple[Run, Figure]]:
    """The figure of the last run of each day that ran what `ratio` needs."""
    chosen: dict[str, tuple[Run, Figure]] = {}
    for run in sorted(runs, key=lambda r: r.started):
        figure = ratio.measure(run.results) if run.suite == ratio.suite else None
        if figure is not None:
            chosen[run.day] = (run, figure)
    return chosen


# -- the table -----------------------------------------------------------------------------


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def _cell(figure: Figure) -> str:
    values, against = figure
    return f"{_span(values) if values else 'not measured'} {against}".strip()


def markdown(runs: Sequence[Run], command: str) -> str:
    lines = [f"Command: `{command}`", ""]
    for suite in ("throughput", "steady"):
        ratios = [r for r in RATIOS if r.suite == suite]
        chosen = {r.label: per_day(runs, r) for r in ratios}
        used = sorted(
            {run.source: run for days in chosen.values() for run, _ in days.values()}.values(),
            key=lambda run: run.started,
        )
        if not used:
            continue
        lines += [f"### {suite}", "", "Runs, the last of each day that ran what a row needs:", ""]
        lines += [f"- {run.started[:16]}Z `{run.source}`" for run in used]
        lines += ["", "| ratio | " + " | ".join(f"{r.day} `{r.source.split(':')[0]}`" for r in used)
                  + " | range | days |", "|---|" + "---|" * (len(used) + 2)]  # fmt: skip
        for ratio in ratios:
            days = chosen[ratio.label]
            by_source = {run.source: figure for run, figure in days.values()}
            cells = []
            for run in used:
                figure = by_source.get(run.source)
                cells.append("" if figure is None else _cell(figure))
            every = [v for _, (values, _) in days.values() for v in values]
            span = _span(every) if every else "-"
            count = f"{len(days)}" if len(days) >= DAYS_NEEDED else f"**{len(days)}: too few**"
            lines.append(f"| {ratio.label} | " + " | ".join(cells) + f" | {span} | {count} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.ranges", description=__doc__)
    parser.add_argument("files", nargs="*", type=Path, help="results.json files")
    parser.add_argument("--git", action="append", default=[], metavar="FOLDER",
                        help="read every committed version of FOLDER/results.json")  # fmt: skip
    parser.add_argument("--since", metavar="REV", help="with --git: from this commit on")
    args = parser.parse_args(argv)
    if not args.files and not args.git:
        parser.error("name results files or --git FOLDER")
    runs = [Run(str(p), json.loads(p.read_text())) for p in args.files]
    for folder in args.git:
        runs += committed(folder, args.since)
    print(markdown(runs, shlex.join(["python", "-m", "bench.ranges", *argv])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
