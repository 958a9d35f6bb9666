"""Tasks for tests that run workers as real processes
(`python -m pgqueue worker tests.apps.tasks:queue`).

Each handler records its run by appending a line to a file in $PGQUEUE_TEST_RUNS, one file
per process, so a test can count exactly how many times each job ran without extra queries.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pgqueue import JobContext, Queue, RetryPolicy

queue = Queue()


def _record(line: str) -> None:
    folder = os.environ.get("PGQUEUE_TEST_RUNS")
    if folder:
        with open(Path(folder) / f"runs-{os.getpid()}.txt", "a") as out:
            out.write(line + "\n")


@queue.task(name="record")
def record(i: int, ctx: JobContext) -> None:
    _record(f"{ctx.job_id} {i}")


@queue.task(name="arecord")
async def arecord(i: int, ctx: JobContext) -> None:
    _record(f"{ctx.job_id} {i}")


@queue.task(name="sleepy")
def sleepy(seconds: float, ctx: JobContext) -> None:
    _record(f"{ctx.job_id} start")
    time.sleep(seconds)
    _record(f"{ctx.job_id} done")


def read_runs(folder: Path) -> list[tuple[int, str]]:
    """(job id, rest of line) for every recorded run, across all processes."""
    runs = []
    for path in sorted(folder.glob("runs-*.txt")):
        for line in path.read_text().splitlines():
            job_id, _, rest = line.partition(" ")
            runs.append((int(job_id), rest))
    return runs


@queue.task(name="asleepy")
async def asleepy(seconds: float, ctx: JobContext) -> None:
    import asyncio

    _record(f"{ctx.job_id} start")
    await asyncio.sleep(seconds)
    _record(f"{ctx.job_id} done")


@queue.task(name="stall_once", max_attempts=3, retry=RetryPolicy(base=0))
async def stall_once(ctx: JobContext) -> int:
    """Hangs on its first attempt (so its worker can be killed mid-job), returns at once after;
    retried at once once rescued."""
    import asyncio

    _record(f"{ctx.job_id} attempt {ctx.attempt}")
    if ctx.attempt == 1:
        await asyncio.sleep(3600)
    return ctx.attempt


@queue.task(name="hog", max_attempts=1)
async def hog(seconds: float, ctx: JobContext) -> None:
    """Blocks its worker's event loop: a slow job in a live worker."""
    _record(f"{ctx.job_id} start")
    time.sleep(seconds)
    _record(f"{ctx.job_id} done")


@queue.task(name="atomic_effect", atomic=True, max_attempts=3)
async def atomic_effect(table: str, marker: str, ctx: JobContext) -> int:
    """Writes a row in its own transaction; hangs on the first run while `marker` is absent,
    so a test can kill its worker mid-job."""
    import asyncio

    from psycopg import sql

    await ctx.connection.execute(
        sql.SQL("INSERT INTO {} (job_id, pid) VALUES (%s, %s)").format(sql.Identifier(table)),
        [ctx.job_id, os.getpid()],
    )
    _record(f"{ctx.job_id} wrote")
    if not Path(marker).exists():
        Path(marker).touch()
        await asyncio.sleep(3600)
    return ctx.attempt


@queue.task(name="noop")
def noop() -> None:
    """Does nothing: for tests that count jobs, not effects."""


@queue.task(name="cancellable")
def cancellable(ctx: JobContext) -> str:
    """A sync handler that runs until its cancellation is requested, checking the flag."""
    _record(f"{ctx.job_id} start")
    deadline = time.monotonic() + 120
    while not ctx.cancel_requested:
        if time.monotonic() > deadline:
            return "never cancelled"
        time.sleep(0.01)
    _record(f"{ctx.job_id} saw cancel")
    return "stopped"


@queue.task(name="acancellable")
async def acancellable(ctx: JobContext) -> None:
    """An async handler that waits until it is cancelled (a long job)."""
    import asyncio

    _record(f"{ctx.job_id} start")
    try:
        await asyncio.sleep(120)
    except asyncio.CancelledError:
        _record(f"{ctx.job_id} cancelled")
        raise


@queue.task(name="tenant_job", retry=RetryPolicy(base=0, jitter=0))
async def tenant_job(key: str, seconds: float, fail_first: bool, ctx: JobContext) -> None:
    """Records its start and end (monotonic ns, one clock for all processes) under its key;
    fails its first attempt when asked, so retries give their slot back too."""
    import asyncio

    _record(f"{ctx.job_id} start {key} {time.monotonic_ns()} {ctx.attempt}")
    await asyncio.sleep(seconds)
    failing = fail_first and ctx.attempt == 1
    _record(
        f"{ctx.job_id} {'fail' if failing else 'end'} {key} {time.monotonic_ns()} {ctx.attempt}"
    )
    if failing:
        raise RuntimeError("first attempt fails")


@queue.task(
    name="two_key_job",
    limits=["tenant:{tenant}", "user:{tenant}:{user}"],
    fairness_key="tenant:{tenant}",
)
async def two_key_job(tenant: int, user: int, seconds: float, ctx: JobContext) -> None:
    """Holds two limit keys (its tenant and its user) while it sleeps, and shares the queue
    fairly between tenants; records each end."""
    import asyncio

    await asyncio.sleep(seconds)
    _record(f"{ctx.job_id} end {ctx.attempt}")


@queue.task(name="wf_step", retry=RetryPolicy(base=0, jitter=0))
async def wf_step(x: int, ctx: JobContext) -> int:
    """A workflow step: records its start and end (monotonic ns, one clock for all processes)
    and returns x + 1. x % 7 == 3 fails its first attempt; x % 11 == 5 hangs on its first
    attempt while PGQUEUE_TEST_HANG names an existing file (its worker is killed)."""
    import asyncio

    _record(f"{ctx.job_id} start {time.monotonic_ns()} {ctx.attempt} {x}")
    hang = os.environ.get("PGQUEUE_TEST_HANG")
    if x % 11 == 5 and ctx.attempt == 1 and hang and os.path.exists(hang):
        _record(f"{ctx.job_id} hang {time.monotonic_ns()} {ctx.attempt} {x}")
        await asyncio.sleep(3600)
    await asyncio.sleep(0.005)
    if x % 7 == 3 and ctx.attempt == 1:
        _record(f"{ctx.job_id} fail {time.monotonic_ns()} {ctx.attempt} {x}")
        raise RuntimeError("first attempt fails")
    _record(f"{ctx.job_id} end {time.monotonic_ns()} {ctx.attempt} {x}")
    return x + 1


@queue.task(name="wf_collect")
def wf_collect(values: list[int], ctx: JobContext) -> int:
    """A chord's callback: records its start with what it received."""
    _record(f"{ctx.job_id} start {time.monotonic_ns()} {ctx.attempt} {sum(values)}")
    _record(f"{ctx.job_id} end {time.monotonic_ns()} {ctx.attempt} {len(values)}")
    return sum(values)


@queue.task(name="wf_fail", max_attempts=1)
async def wf_fail(x: int) -> int:
    """A workflow member that fails for good after a moment: its dependants are cancelled
    while other members of theirs finish at the same time."""
    import asyncio

    await asyncio.sleep(0.002)
    raise RuntimeError(f"member {x} fails")


@queue.task(name="always_fails", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
def always_fails(note: str) -> None:
    """Fails every attempt, naming its argument: one retry, then failed for good."""
    raise ValueError(f"cannot do {note}")


@queue.task(name="needs_file", max_attempts=1)
def needs_file(path: str) -> str:
    """Fails until the file at `path` exists: a job an operator fixes, then retries."""
    return Path(path).read_text()


@queue.task(name="traced_step")
async def traced_step(n: int) -> int:
    """Makes a span of its own, which should be a child of the job's (when tracing is on)."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span(f"inner {n}"):
        return n


@queue.task(name="traced_sync_step")
def traced_sync_step(n: int) -> int:
    """traced_step in a worker thread: the job's span is current there too."""
    from opentelemetry import trace

    with trace.get_tracer("tests").start_as_current_span(f"inner sync {n}"):
        return n


def _stamp_start(dsn: str, into: str, job_id: int, at: float) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.handler_starts (job_id, at) VALUES (%s, to_timestamp(%s))"
            ).format(sql.Identifier(into)),
            (job_id, at),
        )


@queue.task(name="stamp_start")
def stamp_start(dsn: str, into: str, ctx: JobContext) -> None:
    """Writes when its handler started (this process's wall clock, read first thing) to the
    test's table `into.handler_starts`: what a rate-limited service would see."""
    _stamp_start(dsn, into, ctx.job_id, time.time())


@queue.task(name="astamp_start")
async def astamp_start(dsn: str, into: str, ctx: JobContext) -> None:
    """stamp_start as an `async def` handler (the write itself runs in a thread)."""
    import asyncio

    at = time.time()
    await asyncio.to_thread(_stamp_start, dsn, into, ctx.job_id, at)


@queue.task(name="add")
def add(x: int, y: int) -> dict[str, int]:
    """Returns its arguments' sum: a result a test can read back."""
    return {"sum": x + y}


@queue.task(name="await_signal", max_attempts=1)
def await_signal(key: str, ctx: JobContext) -> object:
    """Returns the payload of the signal sent for `key`, parking until it comes."""
    return ctx.wait_for_signal(key, timeout=600)
