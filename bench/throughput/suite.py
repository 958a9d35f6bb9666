"""The throughput bench: pgqueue, its Python peers and the raw SQL bound, side by side.

    python -m bench throughput [--dsn DSN] [--out DIR] [--runs 3] [--systems pgqueue,...]
                               [--workloads drain,enqueue,idle,steady,claim,raw] [--short]

In one invocation, on one server, it runs each workload `--runs` times per system and keeps
every run; each figure is reported as the median with min and max:
  1. drain: N pre-inserted no-op jobs, one worker process, at several concurrencies;
  2. enqueue: one job per transaction (sequential, and 16 concurrent connections), and bulk;
  3. idle latency: enqueue commit -> handler start, jobs enqueued one at a time with gaps;
  4. steady state: a producer at a fixed rate, one job per transaction;
  5. claim cost as the queue grows (pgqueue's claim statement);
and the raw bound: pgbench scripts (bench/throughput/pgbench/) for claim-and-delete at batch 1,
10, 100, single-row inserts, multi-row inserts, plus COPY, on pgqueue's own jobs table;
with bounds that locate the gaps: pgqueue's lifecycle in SQL alone (lease_finish.sql, batch 10
and 100), the same statements sent from psycopg with a no-op coroutine run per job, and the raw
INSERT sent from psycopg in pgqueue's enqueue client shapes.

Each peer runs at each of the settings its documentation gives (bench/throughput/peers.py):
every setting's figures are kept, and each table shows a peer's best, naming the setting.

It makes its own database on the server (dropped at the end, whatever happened). Writes
results.json, results.md and PNG charts to its results folder (bench/report.py) and prints
the table. A peer
whose package is missing (pip install -e '.[peers]') or which cannot run here is reported as
such in the table. `--short` is the CI smoke mode: one tiny run of everything, in seconds.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench import options
from bench.report import Run, guarded
from bench.server import Server, database, scratch_database
from bench.throughput import claimcost, raw, report
from bench.throughput import workloads as work
from bench.throughput.systems import SCHEMA

SYSTEMS = ("pgqueue", "procrastinate", "pgqueuer", "chancy", "oban")
WORKLOADS = ("drain", "enqueue", "idle", "steady", "claim", "raw")
# Each system's import name, and the distribution whose version the results record.
PACKAGES = {
    "pgqueue": "pgqueue",
    "procrastinate": "procrastinate",
    "pgqueuer": "pgqueuer",
    "chancy": "chancy",
    "oban": "oban",
}
DISTRIBUTIONS = PACKAGES | {"pgqueue": "pgqueue-py"}
# procrastinate claims one job per query (about 0.5k jobs/s here), and at concurrency below 10
# every system claims fewer jobs per statement: smaller drains keep each run to seconds.
# Jobs/s does not depend on N once N is well above a batch.
# The latency workloads run every capped setting at this many jobs at once.
LATENCY_CONCURRENCY = 10
DRAIN_SHARE = {"pgqueue": 1.0, "pgqueuer": 1.0, "procrastinate": 0.2, "chancy": 0.2, "oban": 0.2}


@dataclass(frozen=True)
class Config:
    dsn: str | None
    run: Run
    runs: int
    systems: tuple[str, ...]
    workloads: tuple[str, ...]
    drain_jobs: int
    concurrencies: tuple[int, ...]
    enqueue_jobs: int
    bulk_jobs: int
    bulk_batch: int
    clients: int
    latency_jobs: int
    gap: float
    rate: float
    steady_seconds: float
    claim_sizes: tuple[int, ...]
    claims: int
    short: bool
    worker_pgoptions: str | None = None


def parse_args(argv: Sequence[str]) -> Config:
    parser = options.parser(
        "throughput",
        "Throughput and latency of pgqueue, its Python peers and raw SQL.",
        short="the CI smoke run: tiny sizes, one run each",
    )
    add = parser.add_argument
    add("--runs", type=int, help="runs per figure (default 3; short 1)")
    add("--systems", default=",".join(SYSTEMS), help=",".join(SYSTEMS))
    add("--workloads", default=",".join(WORKLOADS), help=",".join(WORKLOADS))
    add("--drain-jobs", type=int, help="jobs per drain run (default 20000)")
    add("--concurrency", help="drain concurrencies, comma-separated (default 1,10,100)")
    add("--enqueue-jobs", type=int, help="jobs per one-per-transaction run (default 2000)")
    add("--bulk-jobs", type=int, help="jobs per bulk run (default 20000)")
    add("--bulk-batch", type=int, default=1000, help="jobs per bulk transaction (default 1000)")
    add("--clients", type=int, default=16, help="concurrent enqueue connections (default 16)")
    add("--latency-jobs", type=int, help="jobs per idle-latency run (default 1000)")
    add("--gap", type=float, default=0.005, help="mean seconds between idle jobs (0.005)")
    add("--rate", type=float, help="steady producer jobs/s (default 500)")
    add("--steady-seconds", type=float, help="seconds per steady run (default 5)")
    add("--claim-sizes", help="queue sizes for claim cost (default 1000,10000,100000,1000000)")
    add("--claims", type=int, help="claims timed per size and run (default 300)")
    add(
        "--worker-pgoptions",
        help="PGOPTIONS for worker processes only, e.g. '-c synchronous_commit=off'",
    )
    args = parser.parse_args(argv)
    short = args.short

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if short else full)

    def ints(flag: str, value: str | None, full: str, small: str) -> tuple[int, ...]:
        text = pick(value, full, small)
        try:
            found = tuple(int(v) for v in text.split(","))
        except ValueError:
            parser.error(f"{flag} takes comma-separated whole numbers, got {text!r}")
        if not found or min(found) <= 0:
            parser.error(f"{flag} takes numbers greater than 0, got {text!r}")
        return found

    config = Config(
        dsn=options.dsn(args.dsn),
        run=Run("throughput", argv, args.out, short),
        runs=pick(args.runs, 3, 1),
        systems=options.choices(parser, "--systems", args.systems, SYSTEMS),
        workloads=options.choices(parser, "--workloads", args.workloads, WORKLOADS),
        drain_jobs=pick(args.drain_jobs, 20000, 300),
        concurrencies=ints("--concurrency", args.concurrency, "1,10,100", "10"),
        enqueue_jobs=pick(args.enqueue_jobs, 2000, 100),
        bulk_jobs=pick(args.bulk_jobs, 20000, 2000),
        bulk_batch=args.bulk_batch,
        clients=args.clients,
        latency_jobs=pick(args.latency_jobs, 1000, 20),
        gap=args.gap,
        rate=pick(args.rate, 500.0, 100.0),
        steady_seconds=pick(args.steady_seconds, 5.0, 0.5),
        claim_sizes=ints(
            "--claim-sizes", args.claim_sizes, "1000,10000,100000,1000000", "100,1000"
        ),
        claims=pick(args.claims, 300, 20),
        short=short,
        worker_pgoptions=args.worker_pgoptions,
    )
    numbers = {
        "--runs": config.runs,
        "--drain-jobs": config.drain_jobs,
        "--enqueue-jobs": config.enqueue_jobs,
        "--bulk-jobs": config.bulk_jobs,
        "--bulk-batch": config.bulk_batch,
        "--clients": config.clients,
        "--latency-jobs": config.latency_jobs,
        "--gap": config.gap,
        "--rate": config.rate,
        "--steady-seconds": config.steady_seconds,
        "--claims": config.claims,
    }
    options.positive(parser, numbers)
    return config


# -- running and summarising -------------------------------------------------------------------


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max of every numeric figure the runs share."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        values = [float(run[key]) for run in runs]
        out[key] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }
    return out


@dataclass
class Bench:
    config: Config
    dsn: str
    available: dict[str, str | None]
    results: dict[str, Any] = field(default_factory=dict)

    def row(
        self, workload: str, system: str, params: dict[str, Any], measure: Callable[[], Any]
    ) -> None:
        """Measure one figure `runs` times (or note why it could not run) into its workload."""
        entry: dict[str, Any] = {"system": system, "params": params}
        label = " ".join(f"{k}={v}" for k, v in params.items())
        print(f"bench: {workload} {system} {label}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            runs = [measure() for _ in range(self.config.runs)]
            entry |= {"runs": runs, "summary": summary(runs)}
            print(f"bench:   done in {time.monotonic() - started:.1f} s", file=sys.stderr)
        except (RuntimeError, psycopg.Error) as exc:
            print(f"bench: {workload} {system} failed: {exc}", file=sys.stderr)
            entry["failed"] = str(exc)[:500]
        self.results[workload]["rows"].append(entry)

    def start(self, workload: str) -> None:
        self.results[workload] = {"loadavg_start": os.getloadavg(), "rows": []}

    def end(self, workload: str) -> None:
        self.results[workload]["loadavg_end"] = os.getloadavg()

    def systems(self) -> list[str]:
        return [s for s in self.config.systems if self.available[s] is None]


def availability(systems: Sequence[str]) -> dict[str, str | None]:
    """None for a system that can run here, else why not."""
    found: dict[str, str | None] = {}
    for name in systems:
        missing = importlib.util.find_spec(PACKAGES[name]) is None
        found[name] = "not installed: pip install -e '.[peers]'" if missing else None
    if "chancy" in systems and found["chancy"] and sys.version_info < (3, 11):
        found["chancy"] = "not installed: Chancy needs Python >= 3.11"
    if "oban" in systems and found["oban"] and sys.version_info < (3, 12):
        found["oban"] = (
            "not run: oban-py (PyPI `oban`) needs Python >= 3.12 and this bench runs on "
            f"Python {platform.python_version()}; `make bench-venv` builds .venv-bench on "
            "Python 3.12 or newer, with every peer, to run the bench from"
        )
    no_asyncpg = importlib.util.find_spec("asyncpg") is None
    if "pgqueuer" in systems and found["pgqueuer"] is None and no_asyncpg:
        found["pgqueuer"] = "not installed: asyncpg (pip install -e '.[peers]')"
    return found


def run_drain(bench: Bench) -> None:
    """Each system at each of its settings: those that cap the jobs at once at each
    concurrency, then those that set no cap (concurrency None)."""
    c = bench.config
    ctx = work.context()
    for name in bench.systems():
        for conc in [*c.concurrencies, None]:
            share = 1.0 if conc is None else min(1.0, conc / 10)
            jobs = max(100, int(c.drain_jobs * DRAIN_SHARE[name] * share))
            for setting in work.system(name).settings(conc):
                bench.row(
                    "drain",
                    name,
                    {"concurrency": conc, "jobs": jobs, "setting": setting},
                    lambda n=name, k=conc, j=jobs, s=setting: work.drain(
                        ctx, n, bench.dsn, j, k, s, c.worker_pgoptions
                    ),
                )


def run_enqueue(bench: Bench) -> None:
    c = bench.config
    ctx = work.context()
    for name in bench.systems():
        for mode, jobs in (
            ("sequential", c.enqueue_jobs),
            ("concurrent", c.enqueue_jobs),
            ("bulk", c.bulk_jobs),
        ):
            params: dict[str, Any] = {"mode": mode, "jobs": jobs}
            if mode == "concurrent":
                params["clients"] = c.clients
            if mode == "bulk":
                params["batch"] = c.bulk_batch
            bench.row(
                "enqueue",
                name,
                params,
                lambda n=name, m=mode, j=jobs: work.enqueue(
                    ctx, n, bench.dsn, m, j, c.clients, c.bulk_batch
                ),
            )


def run_latency(bench: Bench, workload: str) -> None:
    """Each system at each of its settings for 10 jobs at once, and those with no cap."""
    c = bench.config
    ctx = work.context()
    for name in bench.systems():
        if workload == "idle":
            params: dict[str, Any] = {"jobs": c.latency_jobs, "gap_s": c.gap}
            kwargs: dict[str, Any] = {"jobs": c.latency_jobs, "gap": c.gap}
        else:
            jobs = max(1, int(c.rate * c.steady_seconds))
            params = {"rate": c.rate, "seconds": c.steady_seconds, "jobs": jobs}
            kwargs = {"jobs": jobs, "rate": c.rate}
        for conc in (LATENCY_CONCURRENCY, None):
            for setting in work.system(name).settings(conc):
                bench.row(
                    workload,
                    name,
                    params | {"concurrency": conc, "setting": setting},
                    lambda n=name, kw=kwargs, k=conc, s=setting: work.latency(
                        ctx, n, bench.dsn, concurrency=k, setting=s,
                        pgoptions=c.worker_pgoptions, **kw,
                    ),
                )  # fmt: skip


def run_claim(bench: Bench) -> None:
    c = bench.config
    with psycopg.connect(bench.dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {SCHEMA}.jobs")
    for size in sorted(c.claim_sizes):
        bench.row(
            "claim",
            "pgqueue",
            {"queued": size, "batch": 10},
            lambda s=size: claimcost.claim_cost(bench.dsn, s, c.claims),
        )


def run_raw(bench: Bench) -> None:
    c = bench.config
    dsn = bench.dsn
    try:
        raw.pgbench_path()
    except RuntimeError as exc:
        bench.results["raw"]["unavailable"] = str(exc)
        return
    system = "raw SQL"
    for batch in (1, 10, 100):
        for clients in (1, 2):
            jobs = c.drain_jobs if batch > 1 else max(100, c.drain_jobs // 5)
            bench.row(
                "raw",
                system,
                {"workload": "claim_delete", "batch": batch, "clients": clients},
                lambda b=batch, k=clients, j=jobs: raw.claim_delete(dsn, j, b, k),
            )
    for batch in (10, 100):
        for clients in (1, 2):
            bench.row(
                "raw",
                system,
                {"workload": "lease_finish", "batch": batch, "clients": clients},
                lambda b=batch, k=clients: raw.lease_finish(dsn, c.drain_jobs, b, k),
            )
    for batch in (10, 100):
        for shape in raw.SHAPES:
            bench.row(
                "raw",
                "psycopg",
                {"workload": "psycopg_lifecycle", "batch": batch, "shape": shape},
                lambda b=batch, s=shape: raw.lifecycle_psycopg(dsn, c.drain_jobs, b, s),
            )
    for clients in (1, c.clients):
        bench.row(
            "raw",
            "psycopg",
            {"workload": "psycopg_insert", "clients": clients},
            lambda k=clients: raw.psycopg_insert(dsn, c.enqueue_jobs, k),
        )
    for clients in (1, c.clients):
        for notify in (False, True):
            bench.row(
                "raw",
                system,
                {"workload": "insert_notify" if notify else "insert", "clients": clients},
                lambda k=clients, n=notify: raw.insert_one(dsn, c.enqueue_jobs, k, n),
            )
    bench.row(
        "raw",
        system,
        {"workload": "insert_many", "batch": c.bulk_batch},
        lambda: raw.insert_many(dsn, c.bulk_jobs, c.bulk_batch),
    )
    bench.row(
        "raw",
        system,
        {"workload": "copy", "batch": c.bulk_batch},
        lambda: raw.copy(dsn, c.bulk_jobs, c.bulk_batch),
    )


def versions(systems: Sequence[str]) -> dict[str, str]:
    """The installed version of each system that ran."""
    return {name: importlib.metadata.version(DISTRIBUTIONS[name]) for name in systems}


def install(bench: Bench) -> None:
    for name in [*bench.systems(), *([] if "pgqueue" in bench.systems() else ["pgqueue"])]:
        work.system(name).install(bench.dsn)


def collect(config: Config, server: Server, b: Bench) -> dict[str, Any]:
    results = config.run.header(server) | {
        "versions": versions(b.systems()),
        "config": {k: v for k, v in vars(config).items() if k not in ("dsn", "run")},
        "unavailable": {k: v for k, v in b.available.items() if v},
        "workloads": b.results,
    }
    results["targets"] = report.targets(results)
    return results


def bench(config: Config) -> int:
    available = availability(config.systems)
    with database(config.dsn) as server:
        out = config.run.folder(server)
        with scratch_database(server.dsn, "pgqueue_throughput") as dsn:
            b = Bench(config, dsn, available)
            install(b)
            steps: dict[str, Callable[[], None]] = {
                "drain": lambda: run_drain(b),
                "enqueue": lambda: run_enqueue(b),
                "idle": lambda: run_latency(b, "idle"),
                "steady": lambda: run_latency(b, "steady"),
                "claim": lambda: run_claim(b),
                "raw": lambda: run_raw(b),
            }
            for workload in config.workloads:
                b.start(workload)
                steps[workload]()
                b.end(workload)
                partial = collect(config, server, b)
                report.write_json(out, partial | {"partial": True})
    results = collect(config, server, b)
    report.write(out, results)
    print(report.table(results))
    print(f"bench: wrote {out} in {results['runtime_s']} s", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded("throughput", lambda: bench(config))


if __name__ == "__main__":
    sys.exit(main())
