"""Bulk enqueue against the raw COPY, in alternating pairs (issue 6).

    python -m bench.throughput_pairs [--dsn DSN] [--out DIR] [--pairs 6] [--jobs 20000]
                                     [--batch 1000]

The full bench (throughput.py) times pgqueue's bulk enqueue in its enqueue workload and the
raw COPY minutes later, in its raw workload. This runs the same two measurements
(throughput_workloads.enqueue in a spawned child, throughput_raw.copy) one right after the
other, `--pairs` times, and gives each pair's ratio: the ratio when both sides meet the same
server state. Like throughput.py it works in a database of its own, dropped at the end, and
starts the embedded PostgreSQL without --dsn or PGQUEUE_DSN. Writes results.json to --out
(default bench/out/throughput-pairs-<timestamp>/) and prints one line per pair.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import options
from bench import throughput_raw as raw
from bench import throughput_report as report
from bench import throughput_workloads as work
from bench.degradation import database, describe_server
from bench.throughput import bench_database


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.throughput_pairs",
        description="pgqueue's bulk enqueue and the raw COPY, alternating.",
    )
    add = parser.add_argument
    add("--dsn", help="PostgreSQL server to use (default: PGQUEUE_DSN, else embedded)")
    add("--out", type=Path, help="output folder (default bench/out/throughput-pairs-<timestamp>)")
    add("--pairs", type=int, default=6, help="pairs to run (default 6)")
    add("--jobs", type=int, default=20_000, help="jobs per measurement (default 20000)")
    add("--batch", type=int, default=1000, help="jobs per transaction (default 1000)")
    args = parser.parse_args(argv)
    options.positive(parser, {"--pairs": args.pairs, "--jobs": args.jobs, "--batch": args.batch})
    stamp = datetime.now(timezone.utc)
    out = args.out or Path("bench/out") / f"throughput-pairs-{stamp:%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pairs: list[dict[str, float]] = []
    with database(args.dsn or os.environ.get("PGQUEUE_DSN")) as (server_dsn, embedded):
        server = {"embedded": embedded, **describe_server(server_dsn)}
        with bench_database(server_dsn) as dsn:
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
        "bench": "throughput_pairs",
        "command": shlex.join(["python", "-m", "bench.throughput_pairs", *sys.argv[1:]]),
        "started_at": stamp.isoformat(timespec="seconds"),
        "runtime_s": round(time.monotonic() - started, 1),
        "database": server,
        "config": {"pairs": args.pairs, "jobs": args.jobs, "batch": args.batch},
        "pairs": pairs,
        "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
    }
    report.write_json(out, results)
    r = results["ratio"]
    print(
        f"bulk enqueue / raw COPY: median {r['median']:.2f} (min {r['min']:.2f}, max "
        f"{r['max']:.2f}) over {len(pairs)} pairs; wrote {out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
