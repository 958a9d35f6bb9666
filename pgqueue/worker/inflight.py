"""The lease jobs one run of a worker has in flight.

Owns: each running job's task, cancel signal and progress reports; the start of a job the
claim took and the hand-over of its outcome to the completer and the observers; the cancel
requests that reach a job running here; the progress written once a second; and, at a stop,
the jobs left unfinished: those whose cancellation was requested end as cancelled, the rest
go back to their queues without spending an attempt. The fetch loop (loop.py) decides when to
claim and starts what it claims here.

Invariants:
- A job leaves `running` as it ends, and wakes the loop itself: nothing awaits between its
  outcome and its end, so no other part of the worker sees it ended but still running.
- From Python 3.12 a job's task starts eagerly: its handler runs up to its first wait as the
  job is started, and a job that ended there never enters `running`.
- A cancel request for a job that does not run here is none of this worker's business.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from pgqueue.models import ClaimedJob
from pgqueue.registry import CancelSignal, Progress, Registry
from pgqueue.runtime.link import Link
from pgqueue.store.jobs import JobsStore
from pgqueue.store.plan import AsyncConn
from pgqueue.store.workflows import write_progress
from pgqueue.worker.completer import Completer
from pgqueue.worker.events import Bus, CancelRequested
from pgqueue.worker.executor import Executor
from pgqueue.worker.observe import Observers
from pgqueue.worker.outcome import cancelled

log = logging.getLogger("pgqueue.worker")


class InFlight:
    """The run's lease jobs from their start to their outcome; `ended` is set as each ends."""

    def __init__(
        self,
        *,
        registry: Registry,
        worker_id: int,
        link: Link,
        jobs: JobsStore,
        completer: Completer,
        executor: Executor,
        observers: Observers,
    ) -> None:
        """Writes on the worker's claim `link`."""
        self.registry = registry
        self.worker_id = worker_id
        self.link = link
        self.jobs = jobs
        self.completer = completer
        self.executor = executor
        self.observers = observers
        self.ended = asyncio.Event()  # the loop sleeps on it
        self.running: dict[int, asyncio.Task[None]] = {}  # by job id
        self.unfinished: list[ClaimedJob] = []  # cancelled by the stop: put back
        self.abandoned_threads = 0  # sync handlers still running when the stop ended them
        self._cancels: dict[int, CancelSignal] = {}  # running jobs by id
        self._progress: dict[int, tuple[ClaimedJob, Progress]] = {}  # the same jobs' reports

    def subscribe(self, events: Bus) -> None:
        events.subscribe(CancelRequested, lambda e: self.cancel_requested(e.job_id))

    # -- running ----------------------------------------------------------------------------

    def start(self, job: ClaimedJob) -> None:
        task = _job_task(self._run(job), f"pgqueue-job-{job.id}")
        if not task.done():  # one that ended in its first step has already left
            self.running[job.id] = task

    async def _run(self, job: ClaimedJob) -> None:
        """Run `job` and hand its outcome on; as it ends it leaves `running` and wakes the
        loop itself, not through a done callback, which cost each job a second trip through
        the event loop."""
        self._cancels[job.id] = cancel = CancelSignal()
        progress = Progress()
        self._progress[job.id] = (job, progress)
        try:
            self.observers.job_started(job)
            outcome = await self.executor.run(job, cancel=cancel, progress=progress)
            if progress.version > progress.written:
                outcome.progress = progress.report  # written with the outcome
            self.completer.add(outcome)
            self.observers.job_finished(job, outcome)
        except asyncio.CancelledError:
            self.unfinished.append(job)
            raise
        finally:
            del self._cancels[job.id]
            del self._progress[job.id]
            self.running.pop(job.id, None)  # not there yet if this is its first step
            self.ended.set()

    async def write_progress(self) -> None:
        """Write the progress reports made since the last write, one statement for all."""
        rows: list[dict[str, object]] = []
        for job, progress in list(self._progress.values()):
            if progress.version > progress.written:
                progress.written = progress.version
                rows.append(
                    {
                        "id": job.id,
                        "attempt": job.attempt,
                        "worker_id": job.worker_id,
                        "progress": progress.report,
                    }
                )
        if rows:
            schema = self.jobs.schema
            await self.link.run(lambda conn: write_progress(conn, schema, rows))

    # -- cancellation -----------------------------------------------------------------------

    def cancel_requested(self, job_id: int) -> None:
        """Cancellation of a job was requested (a notification, or the fallback check); a job
        this worker is not running is none of its business."""
        cancel = self._cancels.get(job_id)
        if cancel is not None and not cancel.requested:
            log.info("job %s: cancellation requested, stopping it", job_id)
            cancel.request()

    async def check_cancels(self) -> None:
        """The fallback for a lost notification (or poll_only): look for requests on the
        jobs this worker runs, every rescue interval."""
        if not self._cancels:
            return

        ids = list(self._cancels)
        requested = await self.link.run(
            lambda conn: self.jobs.cancel_requested(conn, ids, self.worker_id)
        )
        for job_id in requested:
            self.cancel_requested(job_id)

    # -- stopping ---------------------------------------------------------------------------

    def stopped(self) -> None:
        """Every job's task has ended (the loop's drain): count the sync handlers whose
        threads run on. They cannot be interrupted; their jobs are put back, and any late
        outcome is refused by the completion guard."""
        self.running.clear()  # a job's task cancelled before its first step never left it
        self.abandoned_threads = sum(
            1 for job in self.unfinished if not _is_async(self.registry, job.task)
        )

    async def put_back_unfinished(self) -> None:
        """End the unfinished jobs whose cancellation was requested as cancelled; put the
        rest back in their queues."""
        await self._cancel_unfinished()
        if not self.unfinished:
            return
        ids = [job.id for job in self.unfinished]
        await self.link.run(lambda conn: self.jobs.release_many(conn, ids, self.worker_id))
        log.warning("put %d unfinished jobs back in their queues", len(ids))

    async def _cancel_unfinished(self) -> None:
        """Unfinished jobs whose cancellation was requested (and not heard of in time) end as
        cancelled instead of going back to run again; guarded like any outcome."""
        if not self.unfinished:
            return
        keep_history = self.completer.keep_history

        async def cancel(conn: AsyncConn) -> list[ClaimedJob]:
            ids = [job.id for job in self.unfinished]
            requested = set(await self.jobs.cancel_requested(conn, ids, self.worker_id))
            jobs = [job for job in self.unfinished if job.id in requested]
            if jobs:
                outcomes = [cancelled(job, None) for job in jobs]
                await self.jobs.finish_many(conn, outcomes, keep_history)
            return jobs

        done = await self.link.run(cancel)
        if done:
            log.info("cancelled %d unfinished jobs whose cancellation was requested", len(done))
            self.unfinished = [job for job in self.unfinished if job not in done]


def _is_async(registry: Registry, name: str) -> bool:
    try:
        return registry.get(name).is_async
    except Exception:
        return True


if sys.version_info >= (3, 12):

    def _job_task(run: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A job's task, started at once: its first step runs here, not on a later turn of
        the event loop, so a handler that never waits ends without being scheduled at all.
        The others in its batch start after that step, as they would have anyway."""
        loop = asyncio.get_running_loop()
        return asyncio.Task(run, loop=loop, name=name, eager_start=True)  # type: ignore[call-arg,unused-ignore]

else:

    def _job_task(run: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A job's task (before Python 3.12 no task can start eagerly)."""
        return asyncio.create_task(run, name=name)
