"""Steady load: one worker keeping up while 1, 16 and 64 producer connections enqueue one job
per transaction at rising offered rates, for pgqueue, its peers and the bare-SQL bounds.

    python -m bench steady [--dsn DSN] [--systems pgqueue,...,bound,bound_psycopg,bound_python]
                           [--producers 1,16,64] [--rates 200,500,1000,2000,4000]
                           [--seconds 10] [--settle 5] [--concurrency 100]
                           [--setting SYSTEM=NAME ...] [--rounds 3] [--out DIR] [--short]

Each system runs one worker process at one setting (the throughput suite's names, bench/
throughput/peers.py; `--setting` picks another) and is offered each rate, lowest first, by
each number of producer connections (bench/steady/point.py). Per point: the offered rate,
jobs produced and finished per second end to end, latency from enqueue commit to handler
start (p50/p90/p99), and CPU seconds per 1,000 jobs of the producers, the worker and the
server's backends (and pg_stat_statements' execution time where the server preloads it).
Once a point falls behind, the higher rates for that producer count are skipped. The bounds
(bench/steady/bound.py) are the same points in bare SQL on pgqueue's tables, the producers
pgbench (`bound`) or the suite's own Python producers sending the bare INSERT from psycopg
(`bound_psycopg`), the worker a pgbench client; `bound_python` (bench/steady/bare.py) sends
the same SQL from a bare asyncio worker and is run and measured as the queues are. Ratios
(pgqueue / best peer, pgqueue / each bound) are computed from this run's figures. With
several rounds (three in a full run), every system runs once a round, in a rotated order, and
each figure is the point's median of the rounds, every round's p99 shown beside it
(bench/steady/rounds.py).

Writes results.json and results.md to its results folder (bench/report.py) and prints the
table.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench import options
from bench.report import Run, guarded
from bench.server import Server, database, scratch_database
from bench.steady import bare, bound, cpu, rounds, tables
from bench.steady.point import Point, Worker, run_point
from bench.throughput import raw
from bench.throughput import workloads as work
from bench.throughput.suite import DISTRIBUTIONS, availability

PEERS = ("procrastinate", "pgqueuer", "chancy", "oban")
BOUNDS = ("bound", "bound_psycopg")  # a pgbench worker: bench/steady/bound.py
# A Python worker on the bare SQL, run and measured as the queues are: bench/steady/bare.py.
# bound_python_enqueue is the same worker fed by pgqueue's enqueue, run only when named.
BOUND_PYTHON = "bound_python"
NAMED_ONLY = ("bound_python_enqueue",)
PYTHON_BOUNDS = (BOUND_PYTHON, *NAMED_ONLY)
SYSTEMS = ("pgqueue", *PEERS, *BOUNDS, BOUND_PYTHON)
# The setting each system runs at unless --setting says otherwise: the one that did
# best in the throughput suite's short runs. {n} is the --concurrency, {n1} one more.
SETTINGS = {
    "pgqueue": "default",
    "procrastinate": "concurrency={n}, pool {n1}",
    "pgqueuer": "batch_size=100, no cap",
    "chancy": "AsyncExecutor, concurrency={n}, eager_polling",
    "oban": "limit={n}, pool 2-20",
    BOUND_PYTHON: bare.SETTING,
    "bound_python_enqueue": bare.SETTING,
}


@dataclass(frozen=True)
class Config:
    dsn: str | None
    run: Run
    systems: tuple[str, ...]
    producers: tuple[int, ...]
    rates: tuple[float, ...]
    seconds: float
    settle: float
    concurrency: int
    settings: dict[str, str]
    rounds: int = 1


def _numbers(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[float, ...]:
    try:
        found = tuple(float(v) for v in text.split(","))
    except ValueError:
        parser.error(f"{flag} takes comma-separated numbers, got {text!r}")
    if not found or min(found) <= 0:
        parser.error(f"{flag} takes numbers greater than 0, got {text!r}")
    return found


def parse_args(argv: Sequence[str]) -> Config:
    parser = options.parser(
        "steady",
        "A worker keeping up with producers at rising rates: latency and CPU per job.",
        short="the CI smoke run: 4 producers at 200 jobs/s, 1 s a point",
    )
    add = parser.add_argument
    add("--systems", default=",".join(SYSTEMS),
        help=",".join(SYSTEMS) + "; also " + ",".join(NAMED_ONLY))  # fmt: skip
    add("--producers", help="producer connections per point (default 1,16,64; short 4)")
    add("--rates", help="offered jobs/s, in total (default 200,500,1000,2000,4000; short 200)")
    add("--seconds", type=float, help="seconds of producing per point (default 10; short 1)")
    add("--settle", type=float, help="seconds after the last commit for the last job to start "
        "before the point fell behind (default 5; short 3)")  # fmt: skip
    add("--concurrency", type=int, default=100, help="jobs at once, for capped settings (100)")
    add("--setting", action="append", default=[], metavar="SYSTEM=NAME",
        help="run SYSTEM at the setting NAME (as the throughput suite names them)")  # fmt: skip
    add("--rounds", type=int, help="runs of every system; figures are each point's median "
        "(default 3; short 1)")  # fmt: skip
    args = parser.parse_args(argv)
    options.sized(
        args,
        {"producers": "4", "rates": "200", "seconds": 1.0, "settle": 3.0, "rounds": 1},
        {"producers": "1,16,64", "rates": "200,500,1000,2000,4000", "seconds": 10.0,
         "settle": 5.0, "rounds": 3},
    )  # fmt: skip
    options.positive(
        parser,
        {"--seconds": args.seconds, "--settle": args.settle, "--concurrency": args.concurrency,
         "--rounds": args.rounds},
    )  # fmt: skip
    chosen: dict[str, str] = {}
    for given in args.setting:
        system, _, name = given.partition("=")
        if system not in SETTINGS or not name:
            parser.error(f"--setting takes SYSTEM=NAME with SYSTEM in {','.join(SETTINGS)}")
        chosen[system] = name
    return Config(
        dsn=options.dsn(args.dsn),
        run=Run("steady", argv, args.out, args.short),
        systems=options.choices(parser, "--systems", args.systems, (*SYSTEMS, *NAMED_ONLY)),
        producers=tuple(int(n) for n in _numbers(parser, "--producers", args.producers)),
        rates=tuple(sorted(_numbers(parser, "--rates", args.rates))),
        seconds=args.seconds,
        settle=args.settle,
        concurrency=args.concurrency,
        settings=chosen,
        rounds=args.rounds,
    )


def setting_of(config: Config, name: str) -> tuple[int | None, str]:
    """The concurrency (None: the setting sets no cap) and setting `name` runs at."""
    n = config.concurrency
    chosen = config.settings.get(name, SETTINGS[name].format(n=n, n1=n + 1))
    # A setting named with its own concurrency ("concurrency=10, pool 11") runs at that one.
    named = [int(m) for m in re.findall(r"(?:concurrency|limit)=(\d+)", chosen)]
    system = work.system(name)
    variants = getattr(system, "variants", None)  # settings run only when named

    def known_at(concurrency: int | None) -> dict[str, Any]:
        found = system.settings(concurrency)
        return found | variants(concurrency) if variants is not None else found

    for concurrency in (n, None, *named):
        if chosen in known_at(concurrency):
            return concurrency, chosen
    known = [*known_at(n), *known_at(None)]
    raise RuntimeError(f"{name} has no setting {chosen!r}; its settings: {known}")


def run_system(config: Config, dsn: str, name: str, statements: bool) -> dict[str, Any]:
    concurrency, setting = setting_of(config, name)
    ctx = work.context()
    worker = Worker(ctx, name, dsn, concurrency, setting)
    points: list[dict[str, Any]] = []
    try:
        worker.start()
        for producers in config.producers:
            behind: float | None = None
            for rate in config.rates:
                point = Point(producers, rate, config.seconds, config.settle)
                print(f"bench: steady {name} producers={producers} rate={rate:g}",
                      file=sys.stderr, flush=True)  # fmt: skip
                entry: dict[str, Any] = {"producers": producers, "rate": rate}
                if behind is not None:
                    points.append(entry | {"skipped": f"fell behind at {behind:g} jobs/s"})
                    continue
                work.vacuum_analyze(dsn)  # as autovacuum would have, between points
                figures = run_point(ctx, worker, point, statements)
                points.append(entry | figures)
                if figures["fell_behind"]:
                    behind = rate
                    worker.stop()
                    worker.start()
    finally:
        worker.close()
    return {"concurrency": concurrency, "setting": setting, "points": points}


def run_bound(config: Config, dsn: str, name: str, statements: bool) -> dict[str, Any]:
    ctx = work.context() if name == "bound_psycopg" else None
    points: list[dict[str, Any]] = []
    for producers in config.producers:
        behind: float | None = None
        for rate in config.rates:
            print(f"bench: steady {name} producers={producers} rate={rate:g}", file=sys.stderr)
            entry: dict[str, Any] = {"producers": producers, "rate": rate}
            if behind is not None:
                points.append(entry | {"skipped": f"fell behind at {behind:g} jobs/s"})
                continue
            work.vacuum_analyze(dsn)
            point = Point(producers, rate, config.seconds, config.settle)
            figures = bound.run_point(dsn, point, statements, ctx)
            points.append(entry | figures)
            if figures["fell_behind"]:
                behind = rate
    shape = "insert_one.sql's INSERT from psycopg" if ctx else "pgbench: insert_one.sql"
    return {"setting": f"{shape}; worker.sql, batch {bound.BATCH}", "points": points}


def bench(config: Config) -> int:
    wanted = tuple(s for s in config.systems if s not in BOUNDS)
    available = availability([s for s in wanted if s not in PYTHON_BOUNDS])
    available |= {name: None for name in PYTHON_BOUNDS}
    unavailable = {k: v for k, v in available.items() if v}
    systems: dict[str, Any] = {}
    with database(config.dsn) as server:
        out = config.run.folder(server)
        with scratch_database(server.dsn, "pgqueue_steady") as dsn:
            statements = cpu.statements_unavailable(dsn)
            for name in ("pgqueue", *[s for s in wanted if s != "pgqueue"]):
                if available.get(name) is None:
                    work.system(name).install(dsn)
            runnable = [name for name in wanted if available[name] is None]
            for name in BOUNDS:
                if name not in config.systems:
                    continue
                try:
                    raw.pgbench_path()
                except RuntimeError as exc:
                    unavailable[name] = str(exc)
                    continue
                runnable.append(name)
            ran: dict[str, list[dict[str, Any]]] = {name: [] for name in runnable}
            for index in range(config.rounds):
                if config.rounds > 1:
                    print(f"bench: steady round {index + 1} of {config.rounds}", file=sys.stderr)
                for name in rounds.order(runnable, index):
                    run = run_bound if name in BOUNDS else run_system
                    ran[name].append(run(config, dsn, name, statements is None))
            systems = {name: rounds.combine(ran[name]) for name in runnable}
        results = _results(config, server, systems, unavailable, statements)
    config.run.write(out, "results.json", server, results)
    table = tables.markdown(config.run.header(server) | results)
    (out / "results.md").write_text(table + "\n")
    print(table)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _results(
    config: Config,
    server: Server,
    systems: dict[str, Any],
    unavailable: dict[str, str],
    statements: str | None,
) -> dict[str, Any]:
    ran = [s for s in systems if s not in (*BOUNDS, *PYTHON_BOUNDS)]
    return {
        "versions": {s: importlib.metadata.version(DISTRIBUTIONS[s]) for s in ran},
        "config": {
            "producers": config.producers,
            "rates": config.rates,
            "seconds": config.seconds,
            "settle": config.settle,
            "concurrency": config.concurrency,
            "rounds": config.rounds,
        },
        "latency": "enqueue commit to handler start (bound and bound_psycopg: the row's "
        "created_at to the lease's started_at, from job_history)",
        "cpu": "utime + stime from /proc: producer processes, the worker process, and the "
        "server's backends connected to the bench's database (WAL writer, checkpointer and "
        "autovacuum not counted)",
        "writes": "transactions that wrote (the producers' enqueues included) and WAL "
        "bytes, per job that started, server-wide, from the next transaction id and the WAL "
        "position read before the point and half a second after its last start",
        "pg_stat_statements": statements or "available: statements_ms_per_1000 per point",
        "unavailable": unavailable,
        "systems": systems,
        "ratios": tables.ratios(systems, PEERS),
    }


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded("steady", lambda: bench(config))


if __name__ == "__main__":
    sys.exit(main())
