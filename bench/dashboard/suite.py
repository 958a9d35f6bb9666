"""What watching the queue costs: the dashboard's pages and /metrics with a large history, and
a worker's drain with metrics and tracing on against one with both off.

    python -m bench dashboard [--dsn DSN] [--history 1000000] [--repeat 20] [--jobs 20000]
                              [--rounds 3] [--out DIR]

Fills a fresh schema's history as `bench records` does (--history finished jobs over 30
days, 10 queues, 50 tasks, one of them rare) plus 1,000 live jobs, with one idle worker
process registered. Serves the dashboard with uvicorn in this process and loads each page
--repeat times over HTTP, reporting the median and worst of its server time (the
Server-Timing header: the dashboard's own time, database included) and of the round trip.
Then the same for a /metrics scrape.

Then --rounds rounds of drains of --jobs jobs by one worker process (concurrency 10): no-op
jobs plain, with `--metrics-port`, and with `--metrics-port --trace` (OpenTelemetry's SDK
exporting through a batch processor, bench/dashboard/app.py, the jobs enqueued under
`pgqueue.tracing.instrument()` one enqueue call each, so each has a trace of its own), every
trace kept, one in ten or one in a hundred (a ratio sampler); and jobs that wait a
millisecond, plain and with both.
Interleaved; a drain's rate is its jobs over the span from the first start to the last
finish, from history. Reports each median and its ratio to the plain drain of the same jobs.

Goals: each page at most 100 ms of server time, a scrape at most 50 ms, and the observed
worker at least 0.97 of the plain one. Writes results.json to its results folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.records.suite import fill
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-dashboard-token-0123456789"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser("dashboard", __doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.history < 10_000 or args.repeat < 1 or args.jobs < 1000 or args.rounds < 1:
        parser.error("--history >= 10000, --repeat >= 1, --jobs >= 1000, --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("dashboard", lambda: bench(Run("dashboard", argv, args.out), args))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(dsn: str, schema: str, *extra: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "pgqueue", "worker", "bench.dashboard.app:queue", "--dsn", dsn,
         "--schema", schema, "--log-level", "warning", *extra],
        cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip


class Site:
    """The dashboard under uvicorn in a thread of this process."""

    def __init__(self, dsn: str, schema: str) -> None:
        import uvicorn

        from pgqueue.dashboard import create_app

        self.app = create_app(dsn, schema=schema, token=TOKEN)
        self.port = free_port()
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)

    def get(self, path: str) -> tuple[float, float]:
        """(server ms, round-trip ms) of one GET."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"authorization": f"Bearer {TOKEN}"}
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as reply:
            reply.read()
            timing = reply.headers["server-timing"]
        total = (time.perf_counter() - started) * 1000
        return float(timing.split("dur=")[1]), total

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.app.state.dashboard.close()


def pages(conn: psycopg.Connection[Any], schema: str, rows: int) -> dict[str, str]:
    live = conn.execute(sql.SQL("SELECT min(id) FROM {}").format(sql.Identifier(schema, "jobs")))
    live_id = live.fetchone()[0]  # type: ignore[index]
    return {
        "queues": "/",
        "jobs, newest": "/jobs",
        "jobs, common task": "/jobs?task=t7",
        "jobs, rare task": "/jobs?task=rare",
        "jobs, failed": "/jobs?status=failed",
        "jobs, queue + failed + 7d": "/jobs?queue=q3&status=failed&since=7d",
        "jobs, tenant": "/jobs?tenant=nobody",
        "jobs, deep page": f"/jobs?before_id={rows // 2}",
        "jobs, rare task, deep": f"/jobs?task=rare&before_id={rows // 2}",
        "job, finished": f"/jobs/{rows // 3}",
        "job, live": f"/jobs/{live_id}",
        "workers": "/workers",
        "tenants": "/tenants",
        "recurring": "/recurring",
        "health": "/health",
        "charts' JSON": "/api/series",
        "metrics scrape": "/metrics",
    }


def timed_pages(site: Site, paths: dict[str, str], repeat: int) -> dict[str, dict[str, float]]:
    found = {}
    for name, path in paths.items():
        site.get(path)  # warm: the pool's connection, the templates
        server, total = zip(*(site.get(path) for _ in range(repeat)), strict=True)
        found[name] = {
            "server_median_ms": round(statistics.median(server), 2),
            "server_max_ms": round(max(server), 2),
            "round_trip_median_ms": round(statistics.median(total), 2),
        }
    return found


# What a drain's worker is told to do besides running jobs.
MODES = {
    "plain": ([], None),
    "metrics": (["--metrics-port", "{port}"], None),
    "metrics+trace": (["--metrics-port", "{port}", "--trace"], 1.0),
    "metrics+trace 1/10": (["--metrics-port", "{port}", "--trace"], 0.1),
    "metrics+trace 1/100": (["--metrics-port", "{port}", "--trace"], 0.01),
}
# (job, modes compared): no-op jobs, where the worker's own cost is all there is, and jobs
# that wait a millisecond, as most real jobs wait at least that long on something. Traces
# are kept whole ("metrics+trace": every job's span recorded and exported), one in ten or one
# in a hundred, as OpenTelemetry's ratio sampler keeps them.
DRAINS = (
    (
        "bench_noop",
        ("plain", "metrics", "metrics+trace", "metrics+trace 1/10", "metrics+trace 1/100"),
    ),
    ("bench_io", ("plain", "metrics+trace", "metrics+trace 1/10")),
)


def drain_rate(dsn: str, schema: str, jobs: int, task: str, mode: str) -> float:
    """Jobs per second of one worker process draining `jobs` jobs of `task` in `mode`."""
    from bench.dashboard import app as dashboard_app
    from pgqueue import tracing

    flags, ratio = MODES[mode]
    made = getattr(dashboard_app, task)
    queue = Queue(dsn, schema=schema)
    if ratio is not None:
        # The jobs carry their enqueue span's context and sampling decision, as a traced
        # application's do.
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        tracing.instrument(TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio))))
    try:
        if ratio is None:
            queue.enqueue_many([made.job(n) for n in range(jobs)])
        else:
            # One enqueue call a job, as requests enqueue, so that each job has a trace of
            # its own and the sampler decides for each; one call for the batch would make
            # one trace whose single decision every job follows.
            with psycopg.connect(dsn) as conn:
                for n in range(jobs):
                    queue.enqueue(made.job(n), conn=conn)
    finally:
        tracing.uninstrument()
    queue.close()
    extra = ["--burst", "--concurrency", "10"]
    extra += [a.format(port=free_port()) for a in flags]
    proc = worker(dsn, schema, *extra, env={"PGQUEUE_BENCH_TRACE": str(ratio)} if ratio else {})
    assert proc.wait(600) == 0, "the drain's worker failed"
    history = sql.Identifier(schema, "job_history")
    with psycopg.connect(dsn) as conn:
        span = conn.execute(
            sql.SQL(
                "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM {}"
            ).format(history)
        ).fetchone()
        conn.execute(sql.SQL("DELETE FROM {}").format(history))
    assert span is not None and span[0] == jobs, f"drained {span}"
    return float(jobs / float(span[1]))


def drains(dsn: str, jobs: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Each job's modes, `rounds` times, interleaved so that drift hits them alike."""
    rates: dict[str, dict[str, list[float]]] = {t: {m: [] for m in ms} for t, ms in DRAINS}
    with scratch_schema(dsn, "bench_dashboard_drain") as schema:
        for _ in range(rounds):
            for task, modes in DRAINS:
                for mode in modes:
                    rates[task][mode].append(drain_rate(dsn, schema, jobs, task, mode))
    return rates


def bench(run: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        with scratch_schema(server.dsn, "bench_dashboard") as schema:
            queue = Queue(schema=schema)
            with psycopg.connect(server.dsn, application_name="bench:dashboard") as conn:
                fill(conn, schema, args.history, queue)
                paths = pages(conn, schema, args.history)
            idle = worker(server.dsn, schema, "--queues", "idle")
            site = Site(server.dsn, schema)
            try:
                time.sleep(2)  # the idle worker registers and beats
                results = timed_pages(site, paths, args.repeat)
            finally:
                site.close()
                idle.terminate()
                idle.wait(60)
            rates = drains(server.dsn, args.jobs, args.rounds)
        medians = {t: {m: statistics.median(r) for m, r in ms.items()} for t, ms in rates.items()}
        figures = {
            "history_rows": args.history,
            "repeat": args.repeat,
            "pages": results,
            "drain": {
                "jobs": args.jobs,
                "rounds": args.rounds,
                "concurrency": 10,
                "jobs_per_second": {
                    t: {m: [round(r) for r in rs] for m, rs in ms.items()}
                    for t, ms in rates.items()
                },
                "ratio_to_plain": {
                    t: {m: round(v / ms["plain"], 3) for m, v in ms.items() if m != "plain"}
                    for t, ms in medians.items()
                },
            },
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}, {args.history:,} finished jobs in history")
    print(f"{'page':<28}{'server ms':>10}{'worst':>8}{'round trip':>12}")
    for name, row in results.items():
        print(
            f"{name:<28}{row['server_median_ms']:>10.2f}{row['server_max_ms']:>8.2f}"
            f"{row['round_trip_median_ms']:>12.2f}"
        )
    for task, modes in medians.items():
        line = ", ".join(
            f"{m} {v:,.0f}/s" + ("" if m == "plain" else f" ({v / modes['plain']:.3f})")
            for m, v in modes.items()
        )
        print(f"drain of {args.jobs:,} {task} jobs: {line}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
