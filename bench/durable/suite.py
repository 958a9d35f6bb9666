"""Durable execution: what a checkpoint costs, steps against a chain, parked jobs beside the
queue, and how soon a wait hears of its job.

    python -m bench durable [--dsn DSN] [--parts checkpoints,chains,parked,wake]
                            [--steps 2000] [--per-job 20] [--chains 500] [--rounds 3]
                            [--concurrency 10] [--chain-concurrency 1,10]
                            [--parked 100000] [--queued 10000]
                            [--claims 300] [--drain-jobs 10000] [--waiters 1000]
                            [--gap 0.002] [--out DIR] [--short]

In one run, on one server, in a database of its own (dropped at the end):
1. `checkpoints`: the same work (a no-op; an INSERT into an app table) run bare and as
   `ctx.step`, in turn, --steps times each, in jobs of --per-job, in a lease task and in an
   atomic task (one burst worker in this process, concurrency 1): the latency a step adds,
   p50 and p99, and step over bare.
2. `chains`: --chains durable jobs of ten steps against --chains chains of ten one-step jobs
   (pgqueue's `chain`), the same work per step (no-op lease tasks; INSERTs in atomic tasks),
   enqueued one per transaction and drained by a burst worker at each --chain-concurrency:
   jobs/s, and durable over chain. A "job" here is one durable job or one whole chain.
3. `parked`: two schemas, one with --parked jobs parked by durable sleeps and signal waits,
   inserted in SQL as the runtime leaves them (bench/durable/parked.py): the claim statement's
   time at --queued queued jobs (bench/throughput/claimcost.py), and a burst worker draining
   --drain-jobs no-op jobs (--concurrency); parked over plain.
4. `wake`: --waiters AsyncQueue.wait calls in this process on as many jobs (one shared
   listening connection), their jobs finished one by one --gap seconds apart by a finisher
   process (from each commit to the wait's return), and run by a worker process at
   --concurrency (from each handler's return to the wait's return) (bench/durable/wake.py).

Writes results.json and results.md to its results folder (bench/report.py) and prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench import options
from bench.durable import claims, parked, steps, wake
from bench.durable.render import markdown
from bench.report import Run, guarded
from bench.server import database, scratch_database, scratch_schema

PARTS = ("checkpoints", "chains", "parked", "wake")
SHORT: dict[str, object] = {
    "steps": 40,
    "per_job": 10,
    "chains": 20,
    "rounds": 1,
    "parked": 2000,
    "queued": 1000,
    "claims": 20,
    "drain_jobs": 300,
    "waiters": 50,
}
FULL: dict[str, object] = {
    "steps": 2000,
    "per_job": 20,
    "chains": 500,
    "rounds": 3,
    "parked": 100000,
    "queued": 10000,
    "claims": 300,
    "drain_jobs": 10000,
    "waiters": 1000,
}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "durable",
        __doc__.split("\n\n")[0],
        short="the CI run, in seconds: " + ", ".join(f"{k}={v}" for k, v in SHORT.items()),
    )
    add = parser.add_argument
    add("--parts", default=",".join(PARTS), help=",".join(PARTS))
    add("--steps", type=int, help=f"checkpoints per kind of task and work ({FULL['steps']})")
    add("--per-job", type=int, help=f"checkpoints per job ({FULL['per_job']})")
    add("--chains", type=int, help=f"durable jobs, and chains, per round ({FULL['chains']})")
    add("--rounds", type=int, help=f"rounds of chains and of parked ({FULL['rounds']})")
    add("--concurrency", type=int, default=10, help="the draining worker's concurrency (10)")
    add(
        "--chain-concurrency",
        default="1,10",
        help="the burst worker's concurrencies for the chains part, comma-separated (1,10)",
    )
    add("--parked", type=int, help=f"sleeping and signal-waiting jobs ({FULL['parked']})")
    add("--queued", type=int, help=f"queued jobs when the claim is timed ({FULL['queued']})")
    add("--claims", type=int, help=f"claims timed per schema and round ({FULL['claims']})")
    add("--drain-jobs", type=int, help=f"jobs drained per schema and round ({FULL['drain_jobs']})")
    add("--waiters", type=int, help=f"waits in this process, one job each ({FULL['waiters']})")
    add("--gap", type=float, default=0.002, help="seconds between the finisher's finishes")
    args = parser.parse_args(argv)
    options.sized(args, SHORT, FULL)
    args.parts = options.choices(parser, "--parts", args.parts, PARTS)
    try:
        args.chain_concurrency = tuple(int(v) for v in args.chain_concurrency.split(","))
    except ValueError:
        parser.error(f"--chain-concurrency takes whole numbers, got {args.chain_concurrency!r}")
    if min(args.chain_concurrency) <= 0:
        parser.error(f"--chain-concurrency takes numbers above 0, got {args.chain_concurrency}")
    options.positive(
        parser,
        {f"--{k.replace('_', '-')}": getattr(args, k) for k in FULL}
        | {"--concurrency": args.concurrency, "--gap": args.gap},
    )
    return args


def measure(dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each part asked for, on schemas of its own."""
    found: dict[str, Any] = {}
    steps.make_app_table(dsn)
    if "checkpoints" in args.parts:
        with scratch_schema(dsn, "bench_durable") as schema:
            found["checkpoints"] = steps.checkpoints(dsn, schema, args.steps, args.per_job)
    if "chains" in args.parts:
        with scratch_schema(dsn, "bench_durable") as schema:
            found["chains"] = steps.chains(
                dsn, schema, args.chains, args.rounds, args.chain_concurrency
            )
    if "parked" in args.parts:
        with contextlib.ExitStack() as stack:
            schemas = {
                name: stack.enter_context(scratch_schema(dsn, "bench_durable"))
                for name in ("plain", "parked")
            }
            with psycopg.connect(dsn, autocommit=True) as conn:
                kinds = parked.add_parked(conn, schemas["parked"], args.parked)
            found["parked"] = {"parked_jobs": kinds, "setup": parked.SETUP} | claims.compare(
                dsn,
                schemas,
                queued=args.queued,
                claims=args.claims,
                drain_jobs=args.drain_jobs,
                concurrency=args.concurrency,
                rounds=args.rounds,
            )
    if "wake" in args.parts:
        with scratch_schema(dsn, "bench_durable") as schema:
            commit = wake.by_commit(dsn, schema, args.waiters, args.gap)
        with scratch_schema(dsn, "bench_durable") as schema:
            worker = wake.by_worker(dsn, schema, args.waiters, args.concurrency)
        found["wake"] = {"waiters": args.waiters, "commit": commit, "worker": worker}
    return found


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        with scratch_database(server.dsn, "pgqueue_durable") as dsn:
            figures = measure(dsn, args)
        settings = {k: getattr(args, k) for k in [*FULL, "concurrency", "chain_concurrency", "gap"]}
        figures = {"config": settings | {"parts": list(args.parts)}, "parts": figures}
        run.write(out, "results.json", server, figures)
        text = markdown(run.header(server) | figures)
        (Path(out) / "results.md").write_text(text)
    print(text)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("durable", lambda: bench(Run("durable", argv, args.out, args.short), args))


if __name__ == "__main__":
    raise SystemExit(main())
