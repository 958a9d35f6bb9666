"""Bulk enqueue against the raw COPY, in alternating pairs.

    python -m bench throughput-pairs [--dsn DSN] [--out DIR] [--pairs 6] [--jobs 20000]
                                     [--batch 1000]

The full bench (throughput.py) times pgqueue's bulk enqueue in its enqueue workload and the
raw COPY minutes later, in its raw workload. This runs the same two measurements
(throughput_workloads.enqueue in a spawned child, throughput_raw.copy) one right after the
other, `--pairs` times, and gives each pair's ratio: the ratio when both sides meet the same
server state. Like throughput.py it works in a database of its own, dropped at the end.
Writes results.json to its results folder (bench/report.py) and prints one line per pair.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_database
from bench.throughput import raw
from bench.throughput import workloads as work


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = options.parser(
        "throughput-pairs", "pgqueue's bulk enqueue and the raw COPY, alternating."
    )
    add = parser.add_argument
    add("--pairs", type=int, default=6, help="pairs to run (default 6)")
    add("--jobs", type=int, default=20_000, help="jobs per measurement (default 20000)")
    add("--batch", type=int, default=1000, help="jobs per transaction (default 1000)")
    args = parser.parse_args(argv)
    options.positive(parser, {"--pairs": args.pairs, "--jobs": args.jobs, "--batch": args.batch})
    run = Run("throughput-pairs", argv, args.out)
    return guarded("throughput-pairs", lambda: bench(run, args))


def bench(run: Run, args: argparse.Namespace) -> int:
    pairs: list[dict[str, float]] = []
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        with scratch_database(server.dsn, "pgqueue_throughput") as dsn:
            work.system("pgqueue").install(dsn)
            ctx = work.context()
            for _ in range(args.pairs):
                ours = work.enqueue(ctx, "pgqueue", dsn, "bulk", args.jobs, 1, args.batch)
                bound = raw.copy(dsn, args.jobs, args.batch)
                pair = {
                    "pgqueue": ours["jobs_per_s"],
                    "raw_copy": bound["jobs_per_s"],
                    "ratio": ours["jobs_per_s"] / bound["jobs_per_s"],
                }
                pairs.append(pair)
                print(
                    f"pgqueue {pair['pgqueue']:,.0f}  raw COPY {pair['raw_copy']:,.0f} jobs/s"
                    f"  ratio {pair['ratio']:.2f}",
                    flush=True,
                )
        ratios = [p["ratio"] for p in pairs]
        results: dict[str, Any] = {
            "config": {"pairs": args.pairs, "jobs": args.jobs, "batch": args.batch},
            "pairs": pairs,
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        }
        run.write(out, "results.json", server, results)
    r = results["ratio"]
    print(
        f"bulk enqueue / raw COPY: median {r['median']:.2f} (min {r['min']:.2f}, max "
        f"{r['max']:.2f}) over {len(pairs)} pairs; wrote {out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
