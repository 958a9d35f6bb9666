"""History retention: `pgqueue prune` and the workers' automatic `history_retention`.

Owns: deleting finished jobs older than a cutoff (optionally of some statuses or one queue):
with no filter, first the history's daily partitions that lie wholly before the cutoff, each
dropped at once (history/partitions.py); then what is left, in bounded batches,
`DELETE ... WHERE id IN (SELECT ... LIMIT n)`, each batch its own short transaction; when no
filter is given, periodic ticks older than the cutoff; and last, in batches too, the durable
steps (worker/durable.py) of jobs that are in neither the hot table nor the history any
more. Workers with `history_retention` set prune every `prune_interval` (± 50%), one worker
at a time: each batch first takes a try-advisory lock, and a worker that finds it taken stops
until its next interval. Nothing on the hot path reads history, so pruning never slows claims.

Fails: a bad status or duration is a ConfigurationError; database errors reach the caller
(the CLI), or are logged by the worker's pruner, which tries again next interval.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from pgqueue.errors import ConfigurationError
from pgqueue.migrate import LOCK_MS
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Loop
from pgqueue.store.history import partitions_drop_plan, prune_batch_plan, steps_prune_plan
from pgqueue.store.plan import AsyncConn, Params, SyncConn, run, run_async

log = logging.getLogger("pgqueue.retention")
FINAL_STATUSES = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class Cutoff:
    """Which history rows a prune deletes: finished more than `older_than` before now."""

    older_than: timedelta
    statuses: tuple[str, ...] | None = None
    queue: str | None = None
    batch_size: int = 1000

    def __post_init__(self) -> None:
        if self.older_than < timedelta(0):
            raise ConfigurationError(f"older_than={self.older_than} must be 0 or more")
        unknown = [s for s in self.statuses or () if s not in FINAL_STATUSES]
        if unknown:
            raise ConfigurationError(
                f"cannot prune status {unknown[0]!r}: history holds only "
                f"{', '.join(FINAL_STATUSES)}"
            )
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigurationError(f"batch_size={self.batch_size} must be from 1 to 100000")

    @property
    def whole_history(self) -> bool:
        """No filter: periodic ticks past the cutoff go too."""
        return self.statuses is None and self.queue is None

    def params(self, now: datetime | None) -> dict[str, object]:
        return {
            "older_than": self.older_than.total_seconds(),
            "statuses": list(self.statuses) if self.statuses else None,
            "queue": self.queue,
            "limit": self.batch_size,
            "now": now,
        }


@dataclasses.dataclass
class PruneReport:
    """What a prune deleted, in how many batches, and how long each batch took."""

    deleted: int = 0
    ticks_deleted: int = 0
    steps_deleted: int = 0  # jobs whose recorded steps went: upkeep, not counted as batches
    batch_seconds: list[float] = dataclasses.field(default_factory=list)
    locked_out: bool = False  # another worker held the prune lock
    after: dict[str, datetime] = dataclasses.field(default_factory=dict)  # per statement
    # Whole days dropped before any batch (no filter only): each partition's name and rows
    # as estimated by the planner's statistics.
    partitions: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    def params(self, cutoff: Cutoff, step: str, now: datetime | None) -> Params:
        """The next batch starts where the previous one ended (see job_history_prune)."""
        return cutoff.params(now) | {"after": self.after.get(step)}

    def record(self, step: str, times: Sequence[datetime], seconds: float) -> int:
        """Count a batch that deleted rows of these times; the next starts after the last."""
        if times:
            self.after[step] = max(times)
        if step == "jobs":
            self.deleted += len(times)
        else:
            self.ticks_deleted += len(times)
        self.batch_seconds.append(seconds)
        return len(times)

    @property
    def batches(self) -> int:
        return len(self.batch_seconds)

    @property
    def seconds(self) -> float:
        return sum(self.batch_seconds)


def _steps(cutoff: Cutoff) -> Sequence[str]:
    return ("jobs", "ticks") if cutoff.whole_history else ("jobs",)


def prune(
    conn: SyncConn, schema: str, cutoff: Cutoff, *, now: datetime | None = None
) -> PruneReport:
    """Delete what `cutoff` selects, batch after batch, until none is left. `conn` must be
    in autocommit mode: each batch commits on its own."""
    report = PruneReport()
    if cutoff.whole_history:
        drop = partitions_drop_plan(schema, cutoff.older_than.total_seconds(), LOCK_MS, now)
        report.partitions = run(conn, drop)
    for step in _steps(cutoff):
        while True:
            started = time.perf_counter()
            plan = prune_batch_plan(schema, step, report.params(cutoff, step, now), lock=False)
            times = run(conn, plan)
            deleted = report.record(step, times or [], time.perf_counter() - started)
            if deleted < cutoff.batch_size:
                break
    after: int | None = None
    while True:
        gone = run(conn, steps_prune_plan(schema, after, cutoff.batch_size))
        report.steps_deleted += len(gone)
        if len(gone) < cutoff.batch_size:
            return report
        after = gone[-1]


async def abatch(
    conn: AsyncConn,
    schema: str,
    cutoff: Cutoff,
    step: str,
    report: PruneReport,
    *,
    now: datetime | None = None,
    lock: bool = False,
) -> int | None:
    """One batch in its own transaction on `conn` (autocommit); the async twin of a `prune`
    step. With `lock` it first takes the prune lock, and returns None (and sets
    `report.locked_out`) if another worker holds it."""
    started = time.perf_counter()
    plan = prune_batch_plan(schema, step, report.params(cutoff, step, now), lock=lock)
    times = await run_async(conn, plan)
    if times is None:
        report.locked_out = True
        return None
    return report.record(step, times, time.perf_counter() - started)


class Pruner(Loop):
    """A worker's automatic retention: history older than `retention`, every `interval`; as a
    service, on `link`, a connection of its own."""

    name = "pruner"

    def __init__(
        self,
        schema: str,
        retention: timedelta,
        interval: timedelta,
        batch: int,
        *,
        link: Link | None = None,
    ) -> None:
        self.schema = schema
        self.link = link
        self.cutoff = Cutoff(retention, batch_size=batch)
        self.interval = interval
        self.runs = 0
        self.deleted = 0

    async def prune_once(self, link: Link, now: datetime | None = None) -> PruneReport:
        """One full prune, batch by batch; each batch is one Link operation, so a lost
        connection costs at most the batch in flight."""
        report = PruneReport()
        older_than = self.cutoff.older_than.total_seconds()
        report.partitions = await link.run(
            lambda conn: run_async(
                conn, partitions_drop_plan(self.schema, older_than, LOCK_MS, now)
            )
        )
        for step in _steps(self.cutoff):
            while not report.locked_out:

                async def batch(conn: AsyncConn, step: str = step) -> int | None:
                    return await abatch(
                        conn, self.schema, self.cutoff, step, report, now=now, lock=True
                    )

                deleted = await link.run(batch)
                if deleted is None or deleted < self.cutoff.batch_size:
                    break
        if not report.locked_out:
            report.steps_deleted = await self._prune_steps(link)
        self.runs += 1
        self.deleted += report.deleted
        if report.partitions:
            log.info(
                "dropped %d days of history older than %s (%s, about %d jobs)",
                len(report.partitions),
                self.cutoff.older_than,
                ", ".join(name for name, _ in report.partitions),
                sum(rows for _, rows in report.partitions),
            )
        if report.deleted or report.ticks_deleted:
            log.info(
                "pruned %d finished jobs and %d periodic ticks older than %s in %d batches "
                "(%.2f s)",
                report.deleted,
                report.ticks_deleted,
                self.cutoff.older_than,
                report.batches,
                report.seconds,
            )
        return report

    async def _prune_steps(self, link: Link) -> int:
        """Delete the durable steps of jobs that are gone, batch by batch; how many jobs'."""
        done, after = 0, None
        while True:

            async def batch(conn: AsyncConn, after: int | None = after) -> list[int]:
                plan = steps_prune_plan(self.schema, after, self.cutoff.batch_size)
                return await run_async(conn, plan)  # made in the call: a retry makes it anew

            gone = await link.run(batch)
            done += len(gone)
            if len(gone) < self.cutoff.batch_size:
                return done
            after = gone[-1]

    async def loop(self) -> None:
        """Prune every interval (± 50%)."""
        link = self.link
        assert link is not None, "a Pruner runs its loop on a link"
        await self.every(self.interval.total_seconds(), lambda: self.prune_once(link))

    async def close(self) -> None:
        if self.link is not None:
            await self.link.close()
