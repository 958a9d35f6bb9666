"""Fair shares across keys (migration 0030): the vtimes enqueued fair jobs start at, the
fair claim, key weights and the shares listed for admins. Runs sql/queries/fairness.sql.

Invariant: no queued fair job is behind its queue's clock, which is at or past every
worker's fair hint (enqueues stamp from the clock, and every way back to 'queued' restamps),
so a fair claim that starts at its hint misses nothing but jobs of more urgent priorities,
which their wake-ups announce. Fails only as its statements do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pgqueue.errors import ConfigurationError
from pgqueue.models import CONCURRENCY_KEY, ClaimedJob, NewJob
from pgqueue.queries import query, statement
from pgqueue.store.plan import AsyncConn, Plan, execute, fetch, fetch_one, rows_as
from pgqueue.tenants import FairShare

FairPosition = tuple[int, float]  # (priority, vtime)
FAIR_FLOOR: FairPosition = (-32768, float("-inf"))
FAIR_CEILING: FairPosition = (32767, float("inf"))
MAX_WEIGHT = 1_000_000


@dataclass(frozen=True)
class Stamp:
    """A row of fairness_stamp: where one (queue, key)'s jobs of this enqueue start."""

    queue: str
    key: str
    start: float
    step: float


def stamp_plan(jobs: Sequence[NewJob], schema: str) -> Plan[list[float | None]]:
    """Each job's vtime, None for a job without a fairness key; no statement when no job has
    one. Must run in the transaction that inserts the jobs."""
    fair = [(i, job.options.queue, job.options.fairness_key) for i, job in enumerate(jobs)]
    pairs = [(i, q, k) for i, q, k in fair if k is not None]
    vtimes: list[float | None] = [None] * len(jobs)
    if not pairs:
        return vtimes
    params = {"queues": [q for _, q, _ in pairs], "keys": [k for _, _, k in pairs]}
    yield query("fairness_stamp_lock", schema), params
    rows = yield query("fairness_stamp", schema), params
    starts = {(s.queue, s.key): s for s in rows_as(Stamp, rows)}
    handed: Counter[tuple[str, str]] = Counter()
    for i, q, k in pairs:
        s = starts[(q, k)]
        vtimes[i] = s.start + handed[(q, k)] * s.step
        handed[(q, k)] += 1
    return vtimes


def fair(jobs: Sequence[NewJob]) -> bool:
    """Whether any job carries a fairness key (its enqueue takes the stamp first)."""
    return any(job.options.fairness_key is not None for job in jobs)


@dataclass(frozen=True, slots=True)
class FairClaimParams:
    """job_claim_fair's parameters: up to `limit` fair jobs of `queue` at or after `after`
    (priority, vtime) and at or before `before`, for the worker `worker_id`."""

    queue: str
    after: FairPosition
    limit: int
    worker_id: int
    before: FairPosition = FAIR_CEILING

    def as_params(self) -> dict[str, object]:
        return {
            "queue": self.queue,
            "after_priority": self.after[0],
            "after_vtime": self.after[1],
            "before_priority": self.before[0],
            "before_vtime": self.before[1],
            "limit": self.limit,
            "worker_id": self.worker_id,
            "now": None,
        }


@dataclass
class FairClaimed:
    """One fair claim: the jobs to run, how many rows it walked (run or parked), and the
    highest (priority, vtime) among them, where the next fair claim starts."""

    jobs: list[ClaimedJob]
    walked: int
    top: FairPosition | None
    # The highest (priority, id) among them: how far the plain claim's walk has nothing left
    # of theirs (pgqueue/worker/claimer.py).
    top_id: tuple[int, int] | None = None


def _fair_row(
    id: int,
    task: str,
    args: dict[str, object],
    priority: int,
    attempt: int,
    max_attempts: int,
    queue: str,
    worker_id: int,
    parked: bool,
    trace_context: dict[str, object] | None,
    waited: float | None,
    vtime: float,
) -> tuple[ClaimedJob | None, FairPosition, tuple[int, int]]:
    job = None
    if not parked:
        job = ClaimedJob(
            id, task, args, priority, attempt, max_attempts, queue, worker_id, trace_context, waited
        )
    return job, (priority, vtime), (priority, id)


async def claim_fair(conn: AsyncConn, schema: str, params: FairClaimParams) -> FairClaimed:
    """job_claim_fair: fair jobs in (priority, vtime) order from the hint."""
    rows = await fetch(conn, _fair_row, statement("job_claim_fair", schema), params.as_params())
    jobs = [job for job, _, _ in rows if job is not None]
    top = max((position for _, position, _ in rows), default=None)
    top_id = max((at for _, _, at in rows), default=None)
    return FairClaimed(jobs, len(rows), top, top_id)


@dataclass(frozen=True)
class FairSweepFound:
    """What job_sweep_find_fair saw in one slice: the table's pages, and the positions of the
    queued fair jobs before the hint (their priorities and vtimes, in fair claim order)."""

    pages: int
    priorities: list[int]
    vtimes: list[float]

    @property
    def jobs(self) -> list[FairPosition]:
        return list(zip(self.priorities, self.vtimes, strict=True))


async def sweep_find_fair(
    conn: AsyncConn,
    schema: str,
    queue: str,
    pages: tuple[int, int],
    hint: FairPosition,
    limit: int,
) -> FairSweepFound:
    """The queued fair jobs of `queue` before `hint` in the heap pages [lo, hi), and the
    table's pages now (job_sweep_find_fair)."""
    params = {
        "queue": queue,
        "lo": f"({pages[0]},0)",
        "hi": f"({pages[1]},0)",
        "hint_priority": hint[0],
        "hint_vtime": hint[1],
        "limit": limit,
    }
    return await fetch_one(conn, FairSweepFound, query("job_sweep_find_fair", schema), params)


def set_weight_plan(schema: str, key: str, weight: float | None) -> Plan[None]:
    """Set (weight given) or remove (None: back to 1) a fairness key's weight; checked before
    any connection is taken. Jobs enqueued from then on step by 1 / weight."""
    if not isinstance(key, str) or not CONCURRENCY_KEY.fullmatch(key):
        raise ConfigurationError(
            f"invalid fairness key {key!r}: 1-255 characters without NUL, and not '*'"
        )
    if weight is None:
        yield query("fairness_weight_delete", schema), {"key": key}
        return
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise ConfigurationError(
            f"weight={weight!r} for fairness key {key!r}: give a number above 0 and at most "
            f"{MAX_WEIGHT:,} (1 is the default; 2 gets twice the starts of a key at 1)"
        )
    yield query("fairness_weight_set", schema), {"key": key, "weight": float(weight)}


@dataclass(frozen=True)
class FairnessRow:
    """A row of fairness_list."""

    queue: str
    key: str
    weight: float
    queued: int
    running: int
    started: int
    share: float | None
    owed: float


def shares_plan(schema: str, window_seconds: float) -> Plan[list[FairShare]]:
    """Per queue and fairness key: weight, queued and running jobs, starts over the window,
    the share of the queue's starts received and the share owed."""
    rows = yield query("fairness_list", schema), {"window": window_seconds, "now": None}
    return [
        FairShare.model_validate(row, from_attributes=True) for row in rows_as(FairnessRow, rows)
    ]


async def prune_starts(conn: AsyncConn, schema: str) -> None:
    """Fold the claims' logged starts of past buckets into the counts, drop counts older
    than a day, and the fair clocks' superseded values (the worker's sweep)."""
    await execute(conn, query("fairness_starts_fold", schema), {"now": None})
    await execute(conn, query("fairness_starts_prune", schema), {"now": None})
    await execute(conn, query("fairness_clock_prune", schema), {})
    await execute(conn, query("fairness_key_prune", schema), {})
