"""One system at its setting, one worker process, offered rising rates by paced producers.

Owns: the worker process (the throughput bench's, bench/throughput/workloads.py, which logs
each handler start), the producer processes (each holding some of the producer connections,
one thread per connection, one job per transaction, each connection paced open-loop at its
share of the rate from a common start, and warmed before it by WARMUP_ENQUEUES enqueues of
its own), and one point's figures: the rate offered and
produced, jobs finished per second end to end, latency from enqueue commit to handler start,
CPU per 1,000 jobs of the producers, the worker and the server, and the transactions that
wrote and the WAL bytes per job (bench/steady/cpu.py).
A point whose jobs have not all started `settle` seconds after the last commit fell behind;
its worker is replaced before the next point.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from bench.steady import cpu
from bench.throughput import workloads as work
from bench.throughput.systems import Producer
from bench.throughput.workloads import percentile

PRODUCER_PROCESSES = 2  # at most (the machine has two cores); connections are shared out
START_DELAY_SECONDS = 0.3  # from the go signal to the first scheduled enqueue
FINISH_SECONDS = 0.5  # after the last start, before the write counters are read
# Enqueues each producer connection makes before the point's clock starts, as an
# application's pooled connections have long since made theirs. A new server backend plans
# its first statements, compiles the functions and triggers they call and fills its catalog
# caches, and psycopg prepares a statement only after a few executions: paid by every
# connection at once, that start put a burst of slow jobs into every point's p99, which an
# application with a pool pays once per connection, not once per point. Their jobs are
# numbered apart from the measured ones and run (or, for the bounds, are removed) before
# the clock starts.
WARMUP_ENQUEUES = 10
WARMUP_FIRST_SEQ = 1_500_000_000


@dataclass(frozen=True)
class Point:
    producers: int
    rate: float
    seconds: float
    settle: float


def system_producer(name: str, dsn: str) -> Producer:
    """A producer of system `name` (bench/throughput/workloads.py)."""
    return work.system(name).producer(dsn)


def _producer_child(
    make: Callable[[str], Producer],
    dsn: str,
    conns: list[int],
    producers: int,
    rate: float,
    jobs_each: int,
    ready: Any,
    go: Any,
    start_at: Any,
    release: Any,
    results: Any,
) -> None:
    """Connections `conns` (of `producers`), each enqueueing `jobs_each` jobs at rate /
    producers, staggered so the total is evenly spaced; commit times go back by `results`."""
    opened = [make(dsn) for _ in conns]
    for index, producer in zip(conns, opened, strict=True):
        for seq in warmup_seqs(index):
            producer.enqueue(seq)
    committed: dict[int, float] = {}
    ready.release()
    go.wait()
    t0 = start_at.value
    interval = producers / rate

    def run(index: int, producer: Any) -> None:
        offset = index / rate
        for k in range(jobs_each):
            delay = t0 + offset + k * interval - time.time()
            if delay > 0:
                time.sleep(delay)
            seq = index + k * producers
            producer.enqueue(seq)
            committed[seq] = time.time()

    threads = [
        threading.Thread(target=run, args=(index, producer))
        for index, producer in zip(conns, opened, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for producer in opened:
        producer.close()
    results.put(committed)
    release.wait()


def warmup_seqs(connection: int) -> range:
    """The seqs of the jobs producer connection `connection` enqueues to warm itself."""
    first = WARMUP_FIRST_SEQ + connection * WARMUP_ENQUEUES
    return range(first, first + WARMUP_ENQUEUES)


class Worker:
    """The worker process of one system at one setting, and the log of its handler starts."""

    def __init__(
        self, ctx: BaseContext, name: str, dsn: str, concurrency: int | None, setting: str
    ):
        self.ctx, self.name, self.dsn = ctx, name, dsn
        self.concurrency, self.setting = concurrency, setting
        self.folder = tempfile.TemporaryDirectory(prefix="pgqueue-steady-")
        self.process: Any = None

    def start(self) -> None:
        work.system(self.name).reset(self.dsn)
        self.log = Path(self.folder.name) / f"starts-{time.monotonic_ns()}.log"
        self.log.touch()
        self.offset = 0
        self.stop_event = self.ctx.Event()  # type: ignore[attr-defined]
        args = (
            self.name, self.dsn, self.concurrency, self.setting, None, str(self.log),
            self.stop_event, None, self.ctx.Queue(),  # type: ignore[attr-defined]
        )  # fmt: skip
        self.process = self.ctx.Process(target=work._worker_child, args=args, daemon=True)  # type: ignore[attr-defined]
        self.process.start()
        producer = work.system(self.name).producer(self.dsn)
        try:
            producer.enqueue(work.WARMUP_SEQ)
        finally:
            producer.close()
        self.starts({work.WARMUP_SEQ}, work.READY_TIMEOUT_SECONDS)
        warmed = work.warm_up(self.name, self.dsn, self.log, self.process)
        self.starts(warmed, work.READY_TIMEOUT_SECONDS)  # reads past the warm-up's lines

    def starts(self, seqs: set[int], timeout: float) -> dict[int, float]:
        """Handler starts logged since the last call, once all of `seqs` have started or
        `timeout` has passed (then with those that did)."""
        found: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while True:
            with self.log.open() as log:
                log.seek(self.offset)
                text = log.read()
            complete = text[: text.rfind("\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                seq, at = line.split()
                found.setdefault(int(seq), float(at))
            if seqs <= found.keys() or time.monotonic() > deadline:
                return found
            if not self.process.is_alive():
                raise RuntimeError(f"{self.name} worker exited with {self.process.exitcode}")
            time.sleep(0.02)

    def cpu(self) -> float | None:
        return cpu.process_seconds(self.process.pid)

    def stop(self) -> None:
        if self.process is not None:
            self.stop_event.set()
            work._stop(self.process)
            self.process = None

    def close(self) -> None:
        self.stop()
        self.folder.cleanup()


class Producers:
    """The producer processes of one point, connected and waiting for the go."""

    def __init__(
        self, ctx: BaseContext, make: Callable[[str], Producer], dsn: str, point: Point
    ) -> None:
        self.point = point
        jobs_each = max(1, round(point.rate * point.seconds / point.producers))
        processes = min(point.producers, PRODUCER_PROCESSES)
        ready = ctx.Semaphore(0)  # type: ignore[attr-defined]
        self.go_event, self.release = ctx.Event(), ctx.Event()  # type: ignore[attr-defined]
        self.start_at = ctx.Value("d", 0.0)  # type: ignore[attr-defined]
        self.results = ctx.Queue()  # type: ignore[attr-defined]
        self.children: list[Any] = []
        try:
            for n in range(processes):
                conns = list(range(n, point.producers, processes))
                args = (make, dsn, conns, point.producers, point.rate, jobs_each, ready,
                        self.go_event, self.start_at, self.release, self.results)  # fmt: skip
                child = ctx.Process(target=_producer_child, args=args, daemon=True)  # type: ignore[attr-defined]
                child.start()
                self.children.append(child)
            for _ in self.children:
                if not ready.acquire(timeout=60):
                    raise RuntimeError("the producers did not connect in 60 s")
        except BaseException:
            self.close()
            raise

    def warmed(self) -> set[int]:
        """The seqs of every connection's warm-up jobs."""
        return {seq for n in range(self.point.producers) for seq in warmup_seqs(n)}

    def cpu(self) -> list[float | None]:
        return [cpu.process_seconds(c.pid) for c in self.children]

    def go(self) -> None:
        self.start_at.value = time.time() + START_DELAY_SECONDS
        self.go_event.set()

    def committed(self) -> dict[int, float]:
        """Each job's commit time, once every producer has enqueued its share."""
        found: dict[int, float] = {}
        for _ in self.children:
            found |= self.results.get(timeout=self.point.seconds * 10 + 60)
        return found

    def close(self) -> None:
        self.release.set()
        for child in self.children:
            work._stop(child)


def run_point(ctx: BaseContext, worker: Worker, point: Point, statements: bool) -> dict[str, Any]:
    """One point against a running worker; raises nothing for a point that fell behind (its
    figures say so), RuntimeError for a producer or worker that failed."""
    make = functools.partial(system_producer, worker.name)
    try:
        producers = Producers(ctx, make, worker.dsn, point)
    except RuntimeError as exc:
        raise RuntimeError(f"{worker.name}: {exc}") from None
    try:
        return _measure(worker, point, producers, statements)
    finally:
        producers.close()


def _measure(
    worker: Worker, point: Point, producers: Producers, statements: bool
) -> dict[str, Any]:
    # The warm-up's jobs run, and their outcomes are written, before anything is counted.
    warm = worker.starts(producers.warmed(), point.settle)
    if not producers.warmed() <= warm.keys():
        raise RuntimeError(f"{worker.name}: the producers' warm-up jobs did not all start")
    time.sleep(FINISH_SECONDS)
    sampler = cpu.BackendSampler(worker.dsn).start()
    ms_before = cpu.statements_ms(worker.dsn) if statements else None
    worker_before = worker.cpu()
    producers_before = producers.cpu()
    written_before = cpu.write_counters(worker.dsn)
    producers.go()
    committed = producers.committed()
    producers_after = producers.cpu()
    last_commit = max(committed.values())
    settle = max(0.0, last_commit + point.settle - time.time())
    starts = worker.starts(set(committed), settle)
    time.sleep(FINISH_SECONDS)  # the last jobs' outcomes are written after they start
    written = cpu.writes(written_before, cpu.write_counters(worker.dsn))
    figures = _figures(point, committed, starts) | written
    figures["cpu_s"] = {
        "producers": delta(producers_before, producers_after),
        "worker": _minus(worker.cpu(), worker_before),
        "server_backends": sampler.stop(),
    }
    if ms_before is not None:
        figures["statements_ms"] = cpu.statements_ms(worker.dsn) - ms_before
    return figures | per_thousand(figures)


def _figures(point: Point, committed: dict[int, float], starts: dict[int, float]) -> dict[str, Any]:
    first = min(committed.values())
    started = [seq for seq in committed if seq in starts]
    ms = sorted((starts[seq] - committed[seq]) * 1000 for seq in started)
    figures: dict[str, Any] = {
        "offered_per_s": point.rate,
        "jobs": len(committed),
        "started": len(started),
        "fell_behind": len(started) < len(committed),
        "produced_per_s": len(committed) / max(1e-9, max(committed.values()) - first),
    }
    if ms:
        last = max(starts[seq] for seq in started)
        figures |= {
            "finished_per_s": len(started) / max(1e-9, last - first),
            "p50_ms": percentile(ms, 50),
            "p90_ms": percentile(ms, 90),
            "p99_ms": percentile(ms, 99),
            "max_ms": ms[-1],
            "mean_ms": statistics.fmean(ms),
        }
    return figures


def per_thousand(figures: dict[str, Any]) -> dict[str, Any]:
    """CPU seconds (and statement ms) per 1,000 jobs that started."""
    jobs = figures.get("started") or figures["jobs"]
    found = {
        f"cpu_s_per_1000_{part}": None if seconds is None else seconds * 1000 / jobs
        for part, seconds in figures["cpu_s"].items()
    }
    if figures.get("statements_ms") is not None:
        found["statements_ms_per_1000"] = figures["statements_ms"] * 1000 / jobs
    if "xacts" in figures:
        found["xacts_per_job"] = figures["xacts"] / jobs
        found["wal_bytes_per_job"] = figures["wal_bytes"] / jobs
    return found


def _minus(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def delta(before: list[float | None], after: list[float | None]) -> float | None:
    pairs = [_minus(a, b) for a, b in zip(after, before, strict=True)]
    return None if None in pairs else sum(p for p in pairs if p is not None)
