"""The five workloads of the throughput bench, for any System (throughput_systems.py).

Owns: one measurement each, on a freshly truncated set of tables. Workers and the timed
enqueue loops run in processes of their own (the bench process only produces and reads), so
no two of them share an interpreter lock. Each function returns a flat dict of figures; a
worker or client process that fails or hangs raises RuntimeError naming it.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import os
import queue
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import psycopg

from bench.throughput.systems import RECORDER, PgQueue, System

CHILD_TIMEOUT_SECONDS = 300.0
READY_TIMEOUT_SECONDS = 30.0
WARMUP_SEQ = -1
# Jobs a worker runs before a measured stretch, numbered apart from the measured ones.
WARMUP_JOBS = 1000
WARMUP_FIRST_SEQ = 1_000_000_000


def system(name: str) -> System:
    from bench.steady.bare import BarePython, BarePythonPgQueueEnqueue
    from bench.throughput import peers as throughput_peers

    found: dict[str, System] = {
        "pgqueue": PgQueue(),
        "procrastinate": throughput_peers.Procrastinate(),
        "pgqueuer": throughput_peers.PgQueuer(),
        "chancy": throughput_peers.Chancy(),
        "oban": throughput_peers.ObanPy(),
        "bound_python": BarePython(),  # the steady suite's Python-worker bounds
        "bound_python_enqueue": BarePythonPgQueueEnqueue(),
    }
    return found[name]


def context() -> BaseContext:
    return multiprocessing.get_context("spawn")


# -- child processes ---------------------------------------------------------------------------


def _worker_child(
    name: str,
    dsn: str,
    concurrency: int | None,
    setting: str,
    target: int | None,
    log: str | None,
    stop_event: Any,
    pgoptions: str | None,
    results: Any,
) -> None:
    """A worker at `setting` that stops when the bench says so, or once `target` handlers
    started. `pgoptions` (PGOPTIONS) applies to the worker's own connections only."""
    if pgoptions:
        os.environ["PGOPTIONS"] = pgoptions
    RECORDER.open(Path(log) if log else None, target)
    stop = RECORDER.done
    threading.Thread(target=lambda: (stop_event.wait(), stop.set()), daemon=True).start()
    asyncio.run(system(name).work(dsn, concurrency, stop, setting))
    end = time.time()
    RECORDER.close()
    results.put({"first": RECORDER.first, "end": end, "count": RECORDER.count})


# What each system's client imports. A timed child imports it before its clock starts, as
# no raw bound pays for an import. pgqueue was always imported by then (a spawned child
# re-imports bench.throughput.suite, which imports it), but the peers imported theirs inside the
# timed call: PgQueuer's bulk enqueue went from 35,069 to 43,383 jobs/s once its import was
# outside. A first import of pgqueue takes about 180 ms here.
LIBRARIES = {
    "pgqueue": ("pgqueue",),
    "procrastinate": ("procrastinate",),
    "pgqueuer": ("pgqueuer", "pgqueuer.db", "pgqueuer.queries", "asyncpg"),
    "chancy": ("chancy", "bench.throughput.chancy_jobs"),
    "oban": ("oban", "bench.throughput.oban_jobs"),
}


def _timed_child(name: str, dsn: str, method: str, args: tuple[Any, ...], results: Any) -> None:
    target: Callable[..., None] = getattr(system(name), method)
    for module in LIBRARIES[name]:
        importlib.import_module(module)
    started = time.perf_counter()
    target(dsn, *args)
    results.put({"seconds": time.perf_counter() - started})


def _run_child(ctx: BaseContext, target: Any, args: tuple[Any, ...], label: str) -> dict[str, Any]:
    results = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, results), name=label, daemon=True)  # type: ignore[attr-defined]
    process.start()
    try:
        return _result(process, results, label)
    finally:
        _stop(process)


def _result(process: Any, results: Any, label: str) -> dict[str, Any]:
    deadline = time.monotonic() + CHILD_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            found: dict[str, Any] = results.get(timeout=0.2)
            return found
        except queue.Empty:
            if not process.is_alive() and results.empty():
                raise RuntimeError(f"{label} exited with code {process.exitcode}") from None
    raise RuntimeError(f"{label} did not finish within {CHILD_TIMEOUT_SECONDS:g} s")


def _stop(process: Any) -> None:
    process.join(30)
    if process.is_alive():
        process.terminate()
        process.join(5)


def analyze(dsn: str) -> None:
    """Statistics that know the queue is full, as autovacuum would have them by now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE")


def vacuum_analyze(dsn: str) -> None:
    """What autovacuum would have done to every system's tables by now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def warm_up(name: str, dsn: str, log: Path, process: Any) -> set[int]:
    """Bring a freshly reset system's tables to those of a queue in use before a measured
    stretch: WARMUP_JOBS jobs enqueued in bulk and run by its worker, then VACUUM ANALYZE.
    A reset leaves tables analyzed while empty; with autovacuum off (as on some servers the
    bench runs on) nothing analyzes them again, and a peer whose claim is planned for an
    empty table can fall behind for that reason alone. Returns the warm-up's seqs."""
    seqs = set(range(WARMUP_FIRST_SEQ, WARMUP_FIRST_SEQ + WARMUP_JOBS))
    system(name).enqueue_bulk(dsn, sorted(seqs), WARMUP_JOBS)
    _wait_for(log, seqs, process, READY_TIMEOUT_SECONDS * 2)
    vacuum_analyze(dsn)
    return seqs


# -- 1. drain ----------------------------------------------------------------------------------


def drain(
    ctx: BaseContext,
    name: str,
    dsn: str,
    jobs: int,
    concurrency: int | None,
    setting: str,
    pgoptions: str | None = None,
) -> dict[str, Any]:
    """N pre-inserted no-op jobs, one worker process at `setting`: jobs/s from its first
    handler call to the worker's return (all outcomes written). The worker is stopped
    gracefully once it has started the N-th job, the same way for every system."""
    s = system(name)
    s.reset(dsn)
    s.prefill(dsn, jobs)
    analyze(dsn)
    stop = ctx.Event()  # type: ignore[attr-defined]
    got = _run_child(
        ctx, _worker_child, (name, dsn, concurrency, setting, jobs, None, stop, pgoptions), name
    )
    if got["count"] != jobs or got["first"] is None:
        raise RuntimeError(f"{name} drain ran {got['count']} of {jobs} jobs")
    seconds = got["end"] - got["first"]
    return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds}


# -- 2. enqueue --------------------------------------------------------------------------------


def enqueue(
    ctx: BaseContext, name: str, dsn: str, mode: str, jobs: int, clients: int, batch: int
) -> dict[str, Any]:
    """One client process enqueues `jobs`: sequential (one per transaction), concurrent
    (`clients` connections, one per transaction) or bulk (`batch` per transaction)."""
    system(name).reset(dsn)
    seqs = list(range(jobs))
    args: dict[str, tuple[Any, ...]] = {
        "sequential": (seqs,),
        "concurrent": (seqs, clients),
        "bulk": (seqs, batch),
    }
    got = _run_child(ctx, _timed_child, (name, dsn, f"enqueue_{mode}", args[mode]), name)
    return {"jobs": jobs, "seconds": got["seconds"], "jobs_per_s": jobs / got["seconds"]}


# -- 3 and 4. latency --------------------------------------------------------------------------


def latency(
    ctx: BaseContext,
    name: str,
    dsn: str,
    *,
    jobs: int,
    gap: float | None = None,
    rate: float | None = None,
    concurrency: int | None = 10,
    setting: str = "default",
    pgoptions: str | None = None,
) -> dict[str, Any]:
    """Enqueue commit -> handler start, with one worker process waiting.

    With `gap`: one job at a time, a random pause of 0.5-1.5 x gap after each commit (the
    worker is idle when each arrives). With `rate`: a producer paced at `rate` jobs/s, one per
    transaction; also reports the rate achieved and the completion rate."""
    s = system(name)
    s.reset(dsn)
    stop = ctx.Event()  # type: ignore[attr-defined]
    results = ctx.Queue()  # type: ignore[attr-defined]
    with tempfile.TemporaryDirectory(prefix="pgqueue-throughput-") as tmp:
        log = Path(tmp) / "starts.log"
        log.touch()
        args = (name, dsn, concurrency, setting, None, str(log), stop, pgoptions, results)
        process = ctx.Process(target=_worker_child, args=args, name=name, daemon=True)  # type: ignore[attr-defined]
        process.start()
        producer = s.producer(dsn)
        try:
            producer.enqueue(WARMUP_SEQ)
            _wait_for(log, {WARMUP_SEQ}, process, READY_TIMEOUT_SECONDS)
            warm_up(name, dsn, log, process)
            committed = _produce(producer, jobs, gap, rate)
            starts = _wait_for(log, set(committed), process, 60.0 + jobs / 100)
        finally:
            producer.close()
            stop.set()
            _stop(process)
    return _latencies(committed, starts, rate)


def _produce(producer: Any, jobs: int, gap: float | None, rate: float | None) -> dict[int, float]:
    committed: dict[int, float] = {}
    rng = random.Random(6)
    t0 = time.monotonic()
    for seq in range(jobs):
        if rate is not None:
            delay = t0 + seq / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        producer.enqueue(seq)
        committed[seq] = time.time()
        if gap is not None:
            time.sleep(gap * rng.uniform(0.5, 1.5))
    return committed


def _wait_for(log: Path, seqs: set[int], process: Any, timeout: float) -> dict[int, float]:
    deadline = time.monotonic() + timeout
    while True:
        starts: dict[int, float] = {}
        text = log.read_text()
        # Only whole lines: the worker may be in the middle of writing the last one.
        for line in text[: text.rfind("\n") + 1].splitlines():
            seq, at = line.split()
            starts.setdefault(int(seq), float(at))
        if seqs <= starts.keys():
            return starts
        if not process.is_alive():
            raise RuntimeError(f"{process.name} worker exited with code {process.exitcode}")
        if time.monotonic() > deadline:
            missing = len(seqs - starts.keys())
            raise RuntimeError(f"{process.name}: {missing} jobs did not start in {timeout:g} s")
        time.sleep(0.02)


def _latencies(
    committed: dict[int, float], starts: dict[int, float], rate: float | None
) -> dict[str, Any]:
    ms = sorted((starts[seq] - at) * 1000 for seq, at in committed.items())
    figures = {
        "jobs": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
    }
    if rate is not None:
        first = min(committed.values())
        produced = max(committed.values()) - first
        handled = max(starts[seq] for seq in committed) - first
        figures["target_rate"] = rate
        figures["produced_per_s"] = len(ms) / produced
        figures["completed_per_s"] = len(ms) / handled
    return figures


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, round(p / 100 * len(ordered) + 0.5 - 1e-9))
    return float(ordered[min(rank, len(ordered)) - 1])
