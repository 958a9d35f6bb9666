"""Enqueue scale: one job per transaction from 1, 16 and 64 connections against a raw INSERT,
with the workers busy and with them waiting, and the idle latency.

    python -m bench enqueue-scale [--dsn DSN] [--connections 1,16,64] [--seconds 5]
                                  [--rounds 3] [--latency-jobs 1000] [--out DIR] [--short]

Every transaction that notifies takes PostgreSQL's database-wide notification lock while it
commits, so notifying commits run one at a time. Enqueues notify only workers that wait for
a wake-up (sql/migrations/0015_quiet_wake.sql); this suite measures what that buys.

Two worker processes (bench/enqueue_scale/app.py, concurrency 4 each) serve the queue:
- busy: eight jobs that sleep for an hour hold every slot, and the workers have said they
  want no wake-up for the jobs their next claim finds (checked in wake_listeners);
- waiting: every slot is free and the workers want every wake-up, but the queue is paused,
  so they run nothing: the figure is what the wake-ups cost the enqueue itself, not the
  workers' share of the two cores.
In each state, for each connection count, in turns, --rounds times each for --seconds:
- raw: `INSERT INTO jobs (queue, task, args) VALUES (...)` on the same table, the same
  client code, no wake-up;
- enqueue: AsyncQueue.enqueue(job, conn=...) on autocommit connections;
- busy state only, notify: the same enqueue with one more listener that waits for work, so
  every enqueue notifies, as every enqueue did before quiet wake-ups.
Clients run in two processes (one for a single connection), each an asyncio loop over its
share of the connections, counting commits over the same timed window. Figures are medians
of the rounds; ratios are of medians. Between runs the measured jobs are deleted and the
table vacuumed.

Then the idle latency (commit to handler start, one worker waiting, a job every 0.5-1.5 x
5 ms), as the throughput suite measures it (bench/throughput/workloads.py).

Writes results.json to its results folder (bench/report.py) and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.enqueue_scale.app import hold
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue
from pgqueue.queries import channel

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
CONCURRENCY = 4
APP = "bench.enqueue_scale.app:queue"
GOAL = 0.8  # enqueue / raw INSERT at 16 and 64 connections while the workers are busy


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "enqueue-scale",
        __doc__.split("\n\n")[0],
        short="the CI run: 1 and 4 connections, 1 s, one round, 50 latency jobs",
    )
    parser.add_argument("--connections", help="connection counts (default 1,16,64)")
    parser.add_argument("--seconds", type=float, help="seconds per run (default 5)")
    parser.add_argument("--rounds", type=int, help="runs per figure (default 3)")
    parser.add_argument("--latency-jobs", type=int, help="idle-latency jobs (default 1000)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"connections": "1,4", "seconds": 1.0, "rounds": 1, "latency_jobs": 50},
        full={"connections": "1,16,64", "seconds": 5.0, "rounds": 3, "latency_jobs": 1000},
    )
    try:
        args.connections = tuple(int(n) for n in str(args.connections).split(","))
    except ValueError:
        parser.error(f"--connections takes comma-separated whole numbers, got {args.connections!r}")
    options.positive(
        parser,
        {
            "--seconds": args.seconds,
            "--rounds": args.rounds,
            "--latency-jobs": args.latency_jobs,
            "--connections": min(args.connections),
        },
    )
    return args


# -- clients -----------------------------------------------------------------------------------


def _client(
    dsn: str, schema: str, kind: str, connections: int, seconds: float, go: Any, out: Any
) -> None:
    """A client process: `connections` autocommit connections in one event loop, each
    committing one job per transaction for `seconds` once `go` is set; puts its commits."""

    async def main() -> int:
        from bench.enqueue_scale.app import noop
        from pgqueue import AsyncQueue

        queue = AsyncQueue(None, schema=schema)
        insert = sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args) VALUES ('default', 'bench.noop', %s::jsonb)"
        ).format(sql.Identifier(schema))
        conns = [
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) for _ in range(connections)
        ]
        await asyncio.to_thread(go.wait)
        deadline = time.monotonic() + seconds

        async def one(conn: psycopg.AsyncConnection[Any], n: int) -> int:
            done = 0
            while time.monotonic() < deadline:
                if kind == "raw":
                    await conn.execute(insert, [f'{{"seq": {n}}}'])
                else:
                    await queue.enqueue(noop.job(n), conn=conn)
                done += 1
            return done

        try:
            counts = await asyncio.gather(*(one(c, n) for n, c in enumerate(conns)))
        finally:
            for conn in conns:
                await conn.close()
        return sum(counts)

    out.put(asyncio.run(main()))


def commits_per_second(dsn: str, schema: str, kind: str, connections: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("spawn")
    processes = 1 if connections == 1 else 2
    shares = [connections // processes + (n < connections % processes) for n in range(processes)]
    go, out = ctx.Event(), ctx.Queue()
    children = [
        ctx.Process(target=_client, args=(dsn, schema, kind, share, seconds, go, out))
        for share in shares
    ]
    for child in children:
        child.start()
    try:
        time.sleep(1.0 + 0.02 * connections)  # connected before the window opens
        go.set()
        total = sum(out.get(timeout=seconds + 120) for _ in children)
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    return total / seconds


# -- the workers -------------------------------------------------------------------------------


def _start_workers(dsn: str, schema: str, log: Path) -> list[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "pgqueue", "worker", APP, "--dsn", dsn, "--schema", schema]
    command += ["--concurrency", str(CONCURRENCY)]
    with open(log, "ab") as out:
        return [
            subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
            for _ in range(WORKERS)
        ]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_for(conn: psycopg.Connection[Any], check: str, schema: str, what: str) -> None:
    deadline = time.monotonic() + 120
    query = sql.SQL(check).format(s=sql.Identifier(schema))
    while not (conn.execute(query).fetchone() or (False,))[0]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


QUIET = "SELECT count(*) = 2 FROM {s}.wake_listeners WHERE below <= 0 AND 0 <= above"
WAITING = "SELECT count(*) = 2 FROM {s}.wake_listeners WHERE below > above"


def _clear(conn: psycopg.Connection[Any], schema: str) -> None:
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE task = 'bench.noop'").format(s))
    conn.execute(sql.SQL("VACUUM {}.jobs").format(s))


def _waiting_listener(conn: psycopg.Connection[Any], schema: str, on: bool) -> None:
    """A listener row of a worker that waits for work: every enqueue notifies."""
    s = sql.Identifier(schema)
    if on:
        conn.execute(
            sql.SQL(
                "WITH w AS (INSERT INTO {s}.workers (name, hostname, pid, queues, concurrency)"
                " VALUES ('bench listener', 'bench', 0, '{{default}}', 1) RETURNING id)"
                " INSERT INTO {s}.wake_listeners (worker_id, queue, below, above)"
                " SELECT id, 'default', 32768, 32767 FROM w"
            ).format(s=s)
        )
    else:
        conn.execute(sql.SQL("DELETE FROM {s}.workers WHERE name = 'bench listener'").format(s=s))


def measure_state(
    dsn: str, schema: str, state: str, args: argparse.Namespace, log: Path
) -> dict[str, Any]:
    kinds = ("raw", "enqueue", "notify") if state == "busy" else ("raw", "enqueue")
    rates: dict[str, dict[int, list[float]]] = {k: {n: [] for n in args.connections} for k in kinds}
    wakes = dict.fromkeys(kinds, 0)
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn, autocommit=True) as listener,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        if state == "busy":
            holding = Queue(dsn, schema=schema)
            holding.enqueue_many([hold.job(3600.0) for _ in range(WORKERS * CONCURRENCY)])
            holding.close()
        procs = _start_workers(dsn, schema, log)
        try:
            if state == "busy":
                _wait_for(conn, QUIET, schema, "both workers to be busy and quiet")
            else:
                _wait_for(conn, WAITING, schema, "both workers to wait for work")
                pausing = Queue(dsn, schema=schema)
                pausing.pause_queue("default")
                pausing.close()
            for _ in range(args.rounds):
                for n in args.connections:
                    for kind in kinds:
                        _waiting_listener(conn, schema, kind == "notify")
                        got = commits_per_second(
                            dsn, schema, "raw" if kind == "raw" else "enqueue", n, args.seconds
                        )
                        _waiting_listener(conn, schema, False)
                        wakes[kind] += sum(
                            1 for note in listener.notifies(timeout=0.5) if note.payload[0] != "!"
                        )
                        rates[kind][n].append(got)
                        print(f"  {state:<8} {kind:<8} {n:>3} connections: {got:,.0f}/s")
                        _clear(conn, schema)
        finally:
            _stop(procs)
            s = sql.Identifier(schema)
            conn.execute(sql.SQL("TRUNCATE {}.jobs, {}.workers CASCADE").format(s, s))
    medians = {k: {n: statistics.median(v) for n, v in per.items()} for k, per in rates.items()}
    figures: dict[str, Any] = {"runs": rates, "median_per_s": medians, "wake_ups_sent": wakes}
    figures["enqueue_vs_raw"] = {
        n: round(medians["enqueue"][n] / medians["raw"][n], 3) for n in args.connections
    }
    if state == "busy":
        figures["notify_vs_raw"] = {
            n: round(medians["notify"][n] / medians["raw"][n], 3) for n in args.connections
        }
    return figures


def idle_latency(dsn: str, jobs: int) -> dict[str, Any]:
    from bench.throughput import workloads as work

    work.system("pgqueue").install(dsn)
    return work.latency(work.context(), "pgqueue", dsn, jobs=jobs, gap=0.005)


# -- the run -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded(
        "enqueue-scale", lambda: bench(Run("enqueue-scale", argv, args.out, args.short), args)
    )


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        figures: dict[str, Any] = {
            "connections": list(args.connections),
            "seconds": args.seconds,
            "rounds": args.rounds,
            "workers": {"processes": WORKERS, "concurrency": CONCURRENCY},
        }
        log = out / "workers.log"
        with scratch_schema(server.dsn, "bench_enqscale") as schema:
            for state in ("busy", "waiting"):
                figures[state] = measure_state(server.dsn, schema, state, args, log)
        figures["idle_latency"] = idle_latency(server.dsn, args.latency_jobs)
        log.unlink(missing_ok=True)
        busy = figures["busy"]["enqueue_vs_raw"]
        figures["goal"] = {
            "enqueue_vs_raw_busy_at_least": GOAL,
            "met": all(busy[n] >= GOAL for n in args.connections if n >= 16),
        }
        run.write(out, "results.json", server, figures)
    print(
        f"PostgreSQL {server.version}: one job per transaction, jobs/s (median of {args.rounds});"
        f" wake-ups sent while busy: enqueue {figures['busy']['wake_ups_sent']['enqueue']},"
        f" notify {figures['busy']['wake_ups_sent']['notify']}"
    )
    head = ("workers", "conns", "raw", "enqueue", "ratio", "notify", "ratio")
    print("{:<8} {:>5} {:>9} {:>9} {:>6} {:>9} {:>6}".format(*head))
    for state in ("busy", "waiting"):
        med = figures[state]["median_per_s"]
        for n in args.connections:
            notify = med.get("notify", {}).get(n)
            tail = f" {notify:>9,.0f} {notify / med['raw'][n]:>6.2f}" if notify else ""
            print(
                f"{state:<8} {n:>5} {med['raw'][n]:>9,.0f} {med['enqueue'][n]:>9,.0f}"
                f" {med['enqueue'][n] / med['raw'][n]:>6.2f}{tail}"
            )
    lat = figures["idle_latency"]
    print(
        f"idle latency p50 / p99 / max: {lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} / "
        f"{lat['max_ms']:.2f} ms ({lat['jobs']} jobs)"
    )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
