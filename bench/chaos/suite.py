"""The fault suite: does every committed job run, exactly once when atomic,
and no rolled-back job ever, while workers are killed and the database misbehaves?

    python -m bench chaos [--dsn DSN] [--scenarios kill9,restart,terminate,rollback,longtx]
                          [--modes lease,atomic] [--jobs N] [--rate N] [--short]
                          [--allow-restart-cmd CMD] [--drain-timeout S] [--out DIR]

Each (scenario, mode) runs on a fresh schema with real processes: producers that insert an
order and enqueue its job in one transaction, worker processes (bench/chaos/worker.py), and
the faults, injected from this process:

- kill9: SIGKILL a worker while it has jobs in flight, several times; a replacement starts
  each time;
- restart: restart PostgreSQL (the embedded one with its own pg_ctl; a --dsn server only
  with --allow-restart-cmd, otherwise the row says skipped);
- terminate: pg_terminate_backend every pgqueue session, several times;
- rollback: half of the enqueueing transactions roll back;
- longtx: a REPEATABLE READ transaction idle for the whole run.

Modes: `lease` (an async task recording its run in a file) and `atomic` (an atomic task
writing its run to a table in the job's transaction). After the last fault the run waits
until the queue drains or --drain-timeout passes, then counts (bench/chaos/count.py).

Without --dsn (or PGQUEUE_DSN) it starts the embedded PostgreSQL in a temporary folder. On a
given server it works in a database of its own, created and dropped here, so terminating
`pgqueue:%` sessions and holding a snapshot touch nobody else's work. Writes results.json and
results.md to its results folder (bench/report.py), and keeps each run's logs and records
under runs/. Exits 1 if any promise was broken (see the printed Problems), 2 on a bad
command line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.chaos import count as chaos_count
from bench.chaos import report as chaos_report
from bench.chaos.app import MODES, create_tables
from bench.chaos.faults import (
    Admin,
    LongTransaction,
    WorkerPool,
    kill_mid_batch,
    spawn,
    stop_process,
    terminate_backends,
    wait_registered,
)
from bench.chaos.server import Server, describe, own_database, server
from bench.report import Run, guarded
from bench.server import Server as Described
from pgqueue.dsn import redact
from pgqueue.migrate import apply

SCENARIOS = ("kill9", "restart", "terminate", "rollback", "longtx")
FAULTS = {"kill9": (2, 5), "restart": (2, 3), "terminate": (3, 6)}  # (short, full) counts
PRODUCER_STOP_SECONDS = 60.0


@dataclass(frozen=True)
class Config:
    dsn: str | None
    scenarios: tuple[str, ...]
    modes: tuple[str, ...]
    jobs: int
    rate: float
    producers: int
    workers: int
    concurrency: int
    atomic_concurrency: int
    work_ms: float
    faults: int | None
    short: bool
    drain_timeout: float
    restart_cmd: str | None
    run: Run

    def worker_settings(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "atomic_concurrency": self.atomic_concurrency,
            "heartbeat_interval": 0.5,
            "lease_timeout": 3,
            "rescue_interval": 1,
            "shutdown_grace": 5,
        }

    def fault_count(self, scenario: str) -> int:
        if scenario not in FAULTS:
            return 0
        return self.faults if self.faults is not None else FAULTS[scenario][0 if self.short else 1]


def parse_args(argv: Sequence[str]) -> Config:
    parser = options.parser(
        "chaos",
        "Kill workers, restart and cut the database, roll back: count every job.",
        short="the CI run: 1000 jobs, few faults",
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=",".join(SCENARIOS))
    parser.add_argument("--modes", default=",".join(MODES), help="lease,atomic")
    parser.add_argument("--jobs", type=int, help="enqueue attempts per row (10000; short 1000)")
    parser.add_argument("--rate", type=float, help="attempts per second (800; short 500)")
    parser.add_argument("--producers", type=int, default=2, help="producer processes (2)")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (3)")
    parser.add_argument("--concurrency", type=int, default=10, help="per worker (10)")
    parser.add_argument("--atomic-concurrency", type=int, default=10, help="per worker (10)")
    parser.add_argument("--work-ms", type=float, default=5.0, help="each job's work (5 ms)")
    parser.add_argument("--faults", type=int, help="faults per run (default by scenario)")
    parser.add_argument(
        "--drain-timeout", type=float, help="seconds to wait for the queue to drain (120; short 30)"
    )
    parser.add_argument(
        "--allow-restart-cmd",
        metavar="CMD",
        help="shell command that restarts the --dsn server (the restart scenario needs it)",
    )
    args = parser.parse_args(argv)
    jobs = _default(args.jobs, 1000 if args.short else 10_000)
    rate = _default(args.rate, 500.0 if args.short else 800.0)
    drain_timeout = _default(args.drain_timeout, 30.0 if args.short else 120.0)
    positive = {
        "--jobs": jobs,
        "--rate": rate,
        "--producers": args.producers,
        "--workers": args.workers,
        "--concurrency": args.concurrency,
        "--atomic-concurrency": args.atomic_concurrency,
        "--drain-timeout": drain_timeout,
    }
    for name, value in positive.items():
        if value <= 0:
            parser.error(f"{name} must be greater than 0, got {value}")
    if args.work_ms < 0:
        parser.error(f"--work-ms must be 0 or more, got {args.work_ms}")
    if args.workers < 2:
        parser.error("--workers must be at least 2: kill9 kills one while the others work")
    if args.faults is not None and args.faults < 1:
        parser.error(f"--faults must be at least 1, got {args.faults}")
    return Config(
        dsn=options.dsn(args.dsn),
        scenarios=options.choices(parser, "--scenarios", args.scenarios, SCENARIOS),
        modes=options.choices(parser, "--modes", args.modes, MODES),
        jobs=jobs,
        rate=rate,
        producers=args.producers,
        workers=args.workers,
        concurrency=args.concurrency,
        atomic_concurrency=args.atomic_concurrency,
        work_ms=args.work_ms,
        faults=args.faults,
        short=args.short,
        drain_timeout=drain_timeout,
        restart_cmd=args.allow_restart_cmd,
        run=Run("chaos", [_redacted(a) for a in argv], args.out, args.short),
    )


def _redacted(arg: str) -> str:
    """A command-line argument as results may show it: a DSN's password masked."""
    try:
        has_password = "password" in psycopg.conninfo.conninfo_to_dict(arg)
    except psycopg.ProgrammingError:
        return arg
    return redact(arg) if has_password else arg


def _default(value: Any, otherwise: Any) -> Any:
    return otherwise if value is None else value


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Bench:
    config: Config
    server: Server
    dsn: str  # the bench's own database
    admin: Admin
    out: Path

    def run(self, scenario: str, mode: str) -> dict[str, Any]:
        row: dict[str, Any] = {"scenario": scenario, "mode": mode}
        if scenario == "restart" and (reason := self.server.cannot_restart()):
            return row | {"skipped": reason}
        schema = f"chaos_{scenario}_{mode}"
        run_dir = self.out / "runs" / f"{scenario}-{mode}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        started = time.monotonic()
        with psycopg.connect(self.dsn, autocommit=True, application_name="chaos:setup") as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            apply(conn, schema)
            create_tables(conn, schema)
        try:
            row |= self._exercise(scenario, mode, schema, run_dir)
            row |= chaos_count.measure(self.admin, schema, mode, run_dir)
        finally:
            self.admin.rows(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
        row["expected_attempts"] = self.config.jobs
        row["seconds"] = round(time.monotonic() - started, 1)
        return row

    def _exercise(self, scenario: str, mode: str, schema: str, run_dir: Path) -> dict[str, Any]:
        """Start the processes, inject the faults, wait for the queue to drain, stop all."""
        c = self.config
        pool = WorkerPool(self.dsn, schema, mode, run_dir, c.worker_settings())
        producers: list[subprocess.Popen[bytes]] = []
        events: list[dict[str, Any]] = []
        longtx = LongTransaction(self.dsn, schema) if scenario == "longtx" else None
        try:
            for _ in range(c.workers):
                pool.start()
            wait_registered(self.admin, schema, pool)
            self._start_producers(scenario, mode, schema, run_dir, producers)
            t0 = time.monotonic()
            produce_s = c.jobs / c.rate
            n = c.fault_count(scenario)
            plan = [t0 + produce_s * (k + 1) / (n + 1) for k in range(n)]
            give_up = t0 + 2 * produce_s + PRODUCER_STOP_SECONDS
            while plan or any(p.poll() is None for p in producers):
                pool.check()
                if plan and time.monotonic() >= plan[0]:
                    plan.pop(0)
                    events.append(self._fault(scenario, mode, schema, pool))
                if time.monotonic() > give_up:
                    break  # a producer hangs: it is stopped below and its code reported
                time.sleep(0.02)
            drained, drain_s = self._drain(schema, pool)
            # A worker stopped before it has started up would die of the signal itself.
            wait_registered(self.admin, schema, pool)
        finally:
            pool.stop()
            codes = [stop_process(p, PRODUCER_STOP_SECONDS) for p in producers]
            if longtx is not None:
                events.append(longtx.finish())
        return {
            "faults": events,
            "drained": drained,
            "drain_s": round(drain_s, 1),
            "produce_s": round(produce_s, 1),
            "workers_started": pool.started,
            "worker_exits": pool.exited,
            "worker_stop_codes": pool.stop_codes,
            "producer_codes": codes,
        }

    def _start_producers(
        self,
        scenario: str,
        mode: str,
        schema: str,
        run_dir: Path,
        producers: list[subprocess.Popen[bytes]],
    ) -> None:
        """Start the producers (into `producers`, so they are stopped whatever happens) and
        let them go together once all are connected."""
        c = self.config
        for index in range(c.producers):
            config = {
                "dsn": self.dsn,
                "schema": schema,
                "mode": mode,
                "index": index + 1,
                "count": c.jobs // c.producers + (1 if index < c.jobs % c.producers else 0),
                "rate": c.rate / c.producers,
                "rollback": 0.5 if scenario == "rollback" else 0.0,
                "work_ms": c.work_ms,
                "run_dir": str(run_dir),
            }
            log = run_dir / f"producer-{index + 1}.log"
            producers.append(spawn("bench.chaos.producer", [json.dumps(config)], log))
        deadline = time.monotonic() + 60
        while not all((run_dir / f"ready-{i + 1}").exists() for i in range(c.producers)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in producers):
                raise RuntimeError(f"producers did not get ready; see {run_dir}/producer-*.log")
            time.sleep(0.01)
        (run_dir / "go").touch()

    def _fault(self, scenario: str, mode: str, schema: str, pool: WorkerPool) -> dict[str, Any]:
        at = time.monotonic()
        if scenario == "kill9":
            event = kill_mid_batch(self.admin, pool, schema, mode)
        elif scenario == "terminate":
            event = terminate_backends(self.admin)
        else:
            self.admin.close()
            self.server.restart()
            event = {"fault": "restart", "seconds": round(time.monotonic() - at, 2)}
        print(f"chaos:   {event}", file=sys.stderr)
        return event

    def _drain(self, schema: str, pool: WorkerPool) -> tuple[bool, float]:
        """Wait until no job is live (all finished) or the drain timeout passes."""
        started = time.monotonic()
        deadline = started + self.config.drain_timeout
        live = sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema))
        while self.admin.value(live) > 0:
            pool.check()
            if time.monotonic() > deadline:
                return False, time.monotonic() - started
            time.sleep(0.1)
        return True, time.monotonic() - started


# -- the whole suite ---------------------------------------------------------------------------


def suite(config: Config) -> int:
    rows: list[dict[str, Any]] = []
    with server(config.dsn, config.restart_cmd) as srv, own_database(srv.dsn) as dsn:
        admin = Admin(dsn)
        try:
            found = describe(admin)
            described = Described(
                dsn, srv.embedded is not None, found["server_version"], found["settings"]
            )
            out = config.run.folder(described)
            bench = Bench(config, srv, dsn, admin, out)
            for scenario in config.scenarios:
                for mode in config.modes:
                    print(f"chaos: {scenario} {mode}", file=sys.stderr)
                    row = bench.run(scenario, mode)
                    row["problems"] = chaos_count.problems(row)
                    row["warnings"] = chaos_count.warnings(row)
                    rows.append(row)
                    for problem in row["problems"]:
                        print(f"chaos:   PROBLEM: {problem}", file=sys.stderr)
                    for warning in row["warnings"]:
                        print(f"chaos:   WARNING: {warning}", file=sys.stderr)
        finally:
            admin.close()
    problems = [f"{r['scenario']} {r['mode']}: {p}" for r in rows for p in r["problems"]]
    warnings = [f"{r['scenario']} {r['mode']}: {w}" for r in rows for w in r["warnings"]]
    summary = config.run.header(described) | {
        "settings": {
            "jobs": config.jobs,
            "rate": config.rate,
            "producers": config.producers,
            "workers": config.workers,
            "work_ms": config.work_ms,
            "drain_timeout_s": config.drain_timeout,
            "faults": {s: config.fault_count(s) for s in config.scenarios if s in FAULTS},
            "worker_settings": config.worker_settings(),
        },
        "rows": rows,
        "problems": problems,
        "warnings": warnings,
        "ok": not problems,
    }
    chaos_report.write(out, summary)
    print(chaos_report.table(rows))
    for problem in problems:
        print(f"PROBLEM: {problem}")
    for warning in warnings:
        print(f"WARNING: {warning}")
    print(f"chaos: wrote {out} in {summary['runtime_s']} s", file=sys.stderr)
    return 0 if not problems else 1


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(list(sys.argv[1:] if argv is None else argv))
    return guarded("chaos", lambda: suite(config))


if __name__ == "__main__":
    sys.exit(main())
