"""The long-transaction degradation bench: claims while a transaction holds back VACUUM.

    python -m bench degradation [--dsn DSN] [--duration S] [--rate N] [--workers N]
                                [--strategies plain,hint,default] [--modes control,hold]
                                [--hold S] [--runaway-seconds S] [--waiting N] [--sleeping N]
                                [--fairness-keys N]
                                [--out DIR] [--short]

For each strategy and mode it runs, as separate OS processes, a producer enqueuing no-op jobs
at a fixed rate, the workers, and in `hold` mode a long-runner idle in a REPEATABLE READ
transaction, on a fresh schema that is dropped afterwards. A sampler on its own connection
records one row per second. Strategies: `plain` (one job per claim, no hint: an unprotected
queue), `hint` (one job per claim after a (priority, id) hint, reset every 2 s ± 50% and when
a hinted claim is empty) and `default` (pgqueue.Worker with its defaults).

Writes samples.csv, windows.csv (per 10-s window: depth, enqueue-to-start wait p50/p99, and
each kind of claim and scan's calls, time and buffers: bench/degradation/windows.py),
summary.json and PNG charts to its results folder (bench/report.py) and
prints the summary table. Every process it starts is stopped (and joined) at the end of each
run, and it exits 0 when all runs completed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import options
from bench.degradation import report, windows
from bench.degradation.run import run_one
from bench.degradation.sampler import Sample
from bench.report import Run, guarded
from bench.server import database

STRATEGIES = ("plain", "hint", "default")
MODES = ("control", "hold")
SHORT_DURATION_SECONDS = 4.0
SHORT_RATE = 300.0
CONFIGURE = {"shared_preload_libraries": "pg_stat_statements"}


@dataclass(frozen=True)
class Config:
    dsn: str | None
    duration: float
    rate: float
    workers: int
    strategies: tuple[str, ...]
    modes: tuple[str, ...]
    hold: float | None
    runaway_seconds: float
    waiting: int
    run: Run
    sleeping: int = 0
    fairness_keys: int = 0
    durations: dict[str, float] = field(default_factory=dict)

    def duration_of(self, strategy: str, mode: str) -> float:
        """--durations for 'strategy.mode', else for 'strategy', else --duration."""
        found = self.durations.get(f"{strategy}.{mode}", self.durations.get(strategy))
        return self.duration if found is None else found


def parse_args(argv: Sequence[str]) -> Config:
    parser = options.parser(
        "degradation",
        "Claim throughput and latency while a long transaction holds back VACUUM.",
        short="the CI run: 4 s per run, rate 300",
    )
    parser.add_argument("--duration", type=float, help="seconds per run (default 600; short 4)")
    parser.add_argument(
        "--durations",
        default="",
        help="per-run seconds overriding --duration: STRATEGY[.MODE]=S,... "
        "(e.g. plain=120,hint=120,default.control=300)",
    )
    parser.add_argument("--rate", type=float, help="jobs enqueued per second (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="plain,hint,default")
    parser.add_argument("--modes", default=",".join(MODES), help="control,hold")
    parser.add_argument("--control", action="store_true", help="same as --modes control")
    parser.add_argument("--hold", type=float, help="seconds the long-runner holds (default: all)")
    parser.add_argument("--runaway-seconds", type=float, default=5.0, help="(default 5)")
    parser.add_argument(
        "--waiting",
        type=int,
        default=0,
        help="blocked workflow jobs (chains of ten, their heads a day ahead) in the jobs table "
        "throughout each run (default 0)",
    )
    parser.add_argument(
        "--sleeping",
        type=int,
        default=0,
        help="jobs parked by durable sleeps and signal waits (half each, due in a day or "
        "more; bench/durable/parked.py) in the jobs table throughout each run (default 0)",
    )
    parser.add_argument(
        "--fairness-keys",
        type=int,
        default=0,
        help="the producer gives its jobs fairness keys, round-robin over this many tenants, "
        "so the default strategy's workers claim with the fair claim (default 0: none)",
    )
    args = parser.parse_args(argv)
    strategies = options.choices(parser, "--strategies", args.strategies, STRATEGIES)
    modes = ("control",) if args.control else options.choices(parser, "--modes", args.modes, MODES)
    if args.duration is None:
        args.duration = SHORT_DURATION_SECONDS if args.short else 600.0
    if args.rate is None:
        args.rate = SHORT_RATE if args.short else 1000.0
    duration, rate = float(args.duration), float(args.rate)
    options.positive(
        parser,
        {
            "--duration": duration,
            "--rate": rate,
            "--workers": args.workers,
            "--runaway-seconds": args.runaway_seconds,
        },
    )
    durations = _durations(parser, args.durations)
    for flag, value in (
        ("--waiting", args.waiting),
        ("--sleeping", args.sleeping),
        ("--fairness-keys", args.fairness_keys),
    ):
        if value < 0:
            parser.error(f"{flag} must be 0 or more, got {value}")
    if args.hold is not None and args.hold <= 0:
        parser.error(f"--hold must be greater than 0 seconds, got {args.hold}")
    return Config(
        dsn=options.dsn(args.dsn),
        duration=duration,
        durations=durations,
        rate=rate,
        workers=args.workers,
        strategies=strategies,
        modes=modes,
        hold=args.hold,
        runaway_seconds=args.runaway_seconds,
        waiting=args.waiting,
        sleeping=args.sleeping,
        fairness_keys=args.fairness_keys,
        run=Run("degradation", argv, args.out, args.short),
    )


def _durations(parser: argparse.ArgumentParser, value: str) -> dict[str, float]:
    """'plain=120,default.control=300' -> {'plain': 120.0, 'default.control': 300.0}."""
    found: dict[str, float] = {}
    for item in (v.strip() for v in value.split(",") if v.strip()):
        key, _, seconds = item.partition("=")
        strategy, _, mode = key.partition(".")
        try:
            found[key] = float(seconds)
        except ValueError:
            found[key] = -1.0
        if strategy not in STRATEGIES or (mode and mode not in MODES) or found[key] <= 0:
            parser.error(
                f"--durations takes STRATEGY[.MODE]=SECONDS items with a strategy of "
                f"{','.join(STRATEGIES)}, a mode of {','.join(MODES)} and seconds > 0; "
                f"got {item!r}"
            )
    return found


# -- the whole bench ---------------------------------------------------------------------------


def bench(config: Config) -> int:
    """Every (strategy, mode) run in turn, then the summary, the charts and the table."""
    # pg_stat_statements gives each kind of statement's buffers per window (windows.py); a
    # server at --dsn is used as it is, and without it those columns stay empty.
    with database(config.dsn, configure=CONFIGURE) as server:
        out = config.run.folder(server)
        samples, runs = run_all(config, server.dsn, out)
        summary = summarise(config, runs)
        config.run.write(out, "summary.json", server, summary)
    beside = [
        f"{n:,} {what}"
        for n, what in ((config.waiting, "waiting"), (config.sleeping, "sleeping"))
        if n
    ]
    if config.fairness_keys:
        beside.append(f"fair shares over {config.fairness_keys:,} keys")
    title = (
        f"pgqueue degradation: {config.rate:g} jobs/s, {config.workers} workers, "
        f"PostgreSQL {server.version}" + (f", {' and '.join(beside)} beside" if beside else "")
    )
    report.charts(out, samples, title, config.rate * config.runaway_seconds)
    print(report.table(summary))
    print(windows.table(summary["runs"]))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def run_all(config: Config, dsn: str, out: Path) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Run each strategy in each mode; samples.csv grows after each run."""
    csv_path = out / "samples.csv"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["bench.degradation.roles"])
    samples: list[Sample] = []
    runs: list[dict[str, Any]] = []
    for strategy in config.strategies:
        for mode in config.modes:
            duration = config.duration_of(strategy, mode)
            print(f"bench: {strategy} {mode}: {duration:g} s", file=sys.stderr)
            load_before = os.getloadavg()
            rows, window_rows, notes = run_one(
                ctx,
                dsn,
                strategy,
                mode,
                duration=duration,
                rate=config.rate,
                workers=config.workers,
                hold=config.hold,
                waiting=config.waiting,
                sleeping=config.sleeping,
                fairness_keys=config.fairness_keys,
            )
            report.append_samples(csv_path, rows)
            windows.append(out / "windows.csv", window_rows)
            samples.extend(rows)
            figures = report.summarise_run(
                rows,
                rate=config.rate,
                runaway_seconds=config.runaway_seconds,
                duration=duration,
            )
            # The machine's load around the run: other work on the host shows up here.
            load = {"loadavg_before": load_before, "loadavg_after": os.getloadavg()}
            per_window = {"windows": windows.summarise(window_rows)}
            runs.append(figures | notes | load | per_window | {"duration_s": duration})
    return samples, runs


def summarise(config: Config, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rate": config.rate,
        "duration_s": config.duration,
        "durations_s": config.durations,
        "workers": config.workers,
        "hold_s": config.hold,
        "waiting_jobs": config.waiting,
        "sleeping_jobs": config.sleeping,
        "fairness_keys": config.fairness_keys,
        "runaway_seconds": config.runaway_seconds,
        "runaway_depth": config.rate * config.runaway_seconds,
        "strategies": report.by_strategy(runs),
        "runs": runs,
    }


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded("degradation", lambda: bench(config))


if __name__ == "__main__":
    sys.exit(main())
