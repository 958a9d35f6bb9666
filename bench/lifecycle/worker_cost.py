"""What each job costs the worker process itself, counted: CPU instructions per job.

    python -m bench.lifecycle.worker_cost [--dsn DSN] [--jobs 3000] [--concurrency 10,100]
                                          [--handler async,sync] [--profile]

The lifecycle suite shows that the worker runs the same statements as the bare lifecycle
SQL; what is left between them is the worker's own CPU. Times would be noise on a shared
machine; instructions are not. For each concurrency, one real worker process (`pgqueue
worker --burst`, the app of bench/lifecycle/app.py) drains a bulk-enqueued backlog under
valgrind's callgrind, once with --jobs and once with a tenth of them; the difference of the
two totals over the difference of the jobs is the instructions (Ir) per job, with the
process's start and stop left out. Each handler kind is measured apart: `async` (an `async
def` no-op, run on the event loop, as the throughput bench's drain runs) and `sync` (a `def`
no-op, run in the worker's thread pool, as the lifecycle suite's). Without a DSN it starts
the embedded PostgreSQL.

--profile runs the larger drain once more under cProfile instead, at each concurrency, and
prints the functions that took the most time of their own: where the instructions go.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import options
from bench.lifecycle.app import ASYNC_TASK, TASK
from bench.lifecycle.suite import BULK_BATCH, ROOT, _worker
from bench.server import database, scratch_schema

HANDLERS = {"async": ASYNC_TASK, "sync": TASK}
_TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.MULTILINE)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser("lifecycle.worker_cost", __doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs of the larger drain")
    parser.add_argument("--concurrency", default="10,100", help="comma-separated")
    parser.add_argument("--handler", default="async,sync", help="comma-separated, of async,sync")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile summary")
    args = parser.parse_args(argv)
    options.positive(parser, {"--jobs": args.jobs})
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.handler = options.choices(parser, "--handler", args.handler, tuple(HANDLERS))
    if args.jobs < 100:
        parser.error("--jobs must be at least 100: the smaller drain is a tenth of it")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    with database(options.dsn(args.dsn)) as server:
        for handler in args.handler:
            task = HANDLERS[handler]
            for concurrency in args.concurrency:
                small, large = args.jobs // 10, args.jobs
                counts = {n: instructions(server.dsn, task, n, concurrency) for n in (small, large)}
                per_job = (counts[large] - counts[small]) / (large - small)
                print(
                    f"{handler} c{concurrency}: {per_job:,.0f} Ir per job "
                    f"({small} jobs: {counts[small]:,} Ir, {large} jobs: {counts[large]:,} Ir)",
                    flush=True,
                )
                if args.profile:
                    profile(server.dsn, task, large, concurrency)
    return 0


def _command(dsn: str, schema: str, concurrency: int) -> list[str]:
    command = ["-m", "pgqueue", "worker", "bench.lifecycle.app:queue"]
    command += ["--dsn", dsn, "--schema", schema, "--concurrency", str(concurrency)]
    return [*command, "--burst", "--no-periodic", "--log-level", "warning"]


def instructions(dsn: str, task: str, jobs: int, concurrency: int) -> int:
    """The instructions one burst worker process ran to drain `jobs` jobs of `task`."""
    with scratch_schema(dsn, "bench_worker_cost") as schema, tempfile.TemporaryDirectory() as tmp:
        _worker(dsn, schema, 1)  # makes the history's partitions, outside the count
        _enqueue(dsn, schema, task, jobs)
        out = Path(tmp) / "callgrind.out"
        valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        _run([*valgrind, sys.executable, *_command(dsn, schema, concurrency)])
        _drained(dsn, schema)
        found = _TOTALS.search(out.read_text(errors="replace"))
        if found is None:
            raise RuntimeError(f"no totals in callgrind's output {out}")
        return int(found.group(1))


def profile(dsn: str, task: str, jobs: int, concurrency: int) -> None:
    """The drain once more under cProfile: the top functions by their own time."""
    with scratch_schema(dsn, "bench_worker_cost") as schema, tempfile.TemporaryDirectory() as tmp:
        _worker(dsn, schema, 1)
        _enqueue(dsn, schema, task, jobs)
        out = Path(tmp) / "profile.out"
        _run(
            [sys.executable, "-m", "cProfile", "-o", str(out), *_command(dsn, schema, concurrency)]
        )
        _drained(dsn, schema)
        import pstats

        print(f"c{concurrency}, {jobs} jobs, by own time:")
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(30)


def _enqueue(dsn: str, schema: str, name: str, jobs: int) -> None:
    """`jobs` jobs of the task `name`, enqueued in bulk (the lifecycle suite's batches)."""
    import psycopg

    from pgqueue import Queue

    queue = Queue(dsn, schema=schema)
    task = queue.declare(name)
    with psycopg.connect(dsn) as conn:
        for first in range(0, jobs, BULK_BATCH):
            seqs = range(first, min(first + BULK_BATCH, jobs))
            queue.enqueue_many([task.job(seq=seq) for seq in seqs], conn=conn)
            conn.commit()


def _run(command: list[str]) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the worker failed ({done.returncode}): {done.stderr[-2000:]}")


def _drained(dsn: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "jobs"))
        )
        left = row.fetchone()
    if left and left[0]:
        raise RuntimeError(f"the worker left {left[0]} jobs in {schema}.jobs")


if __name__ == "__main__":
    sys.exit(main())
