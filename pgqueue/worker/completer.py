"""Writes job outcomes back in batches, one guarded statement per batch.

Owns: the outcomes the executor produced and not yet written. Each batch is one statement
(job_finish_many): finished jobs move to history (or are deleted when history is off),
retried jobs go back with their error. A row moves only while it is still running the same
attempt for this worker, so a late write never moves a job another actor has moved. On a
connection fault the batch is kept and written after reconnecting; a deadlock is retried; a
batch the database refuses is written one outcome at a time, and an outcome refused alone is
recorded as a failure that says why. Writing never raises: the worker lives on. Stopping
writes every outcome added before it, until the deadline; outcomes still unwritten then leave
their jobs running, for the rescuer.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Health
from pgqueue.store.jobs import JobsStore
from pgqueue.worker.outcome import Outcome

log = logging.getLogger("pgqueue.worker")
# Outcomes written by one statement, at most. Each write is a commit that waits for its WAL
# flush, so while the completer lags, fewer and larger batches are what keeps up with the
# claims.
OUTCOME_BATCH = 1000


class Completer:
    name = "completer"

    def __init__(self, link: Link, schema: str, keep_history: bool, max_batch: int) -> None:
        self.link = link
        self.schema = schema
        self.keep_history = keep_history
        self.max_batch = max_batch
        self.store = JobsStore(schema)
        self._pending: list[Outcome] = []
        self._ready = asyncio.Event()
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._writing: list[Outcome] = []
        self.written = 0
        self.retried = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="pgqueue-complete")

    async def stop(self, deadline: float) -> None:
        self.close()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self._task, max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            log.error(
                "stopped with %d outcomes unwritten; their jobs stay running until rescued",
                len(self.job_ids()),
            )

    def health(self) -> Health:
        waiting = len(self._pending) + len(self._writing)
        return Health(self._task is not None and not self._task.done(), f"{waiting} unwritten")

    def add(self, outcome: Outcome) -> None:
        if outcome.settled:  # written by the handler's own statement (a job parked)
            return
        self._pending.append(outcome)
        self._idle.clear()
        self._ready.set()

    def job_ids(self) -> list[int]:
        """Jobs whose outcome is known here but not yet written: still ours in the table."""
        return [o.job.id for o in self._pending] + [o.job.id for o in self._writing]

    async def flushed(self) -> None:
        """Return once every outcome added so far is written."""
        await self._idle.wait()

    async def run(self) -> None:
        """Write batches as outcomes arrive; returns after close() once all are written."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._pending:
                batch = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                self._writing = batch
                await self._write(batch)
                self._writing = []
            self._idle.set()
            if self._closing:
                return

    def close(self) -> None:
        self._closing = True
        self._ready.set()

    async def _write(self, batch: list[Outcome]) -> None:
        """Write a batch; never raises. Rows are locked in id order, like everywhere else."""
        batch.sort(key=lambda o: o.job.id)
        for attempt in range(5):
            try:
                await self._write_once(batch)
                return
            except psycopg.errors.TransactionRollback as exc:  # deadlock, serialization
                log.warning("outcome batch hit %s; retrying", type(exc).__name__)
                await asyncio.sleep(0.05 * (attempt + 1))
            except psycopg.Error as exc:
                await self._write_apart(batch, exc)
                return
        await self._write_apart(batch, None)

    async def _write_apart(self, batch: list[Outcome], exc: Exception | None) -> None:
        """A batch the database refused: write its outcomes one by one, so one bad outcome
        cannot hold back the others. An outcome refused alone is stored as failed, without its
        result and error details and not retried (its side effects must not run again), with
        a note that says why: a job never reads as a success whose result was dropped."""
        if len(batch) > 1:
            for outcome in batch:
                await self._write([outcome])
            return
        (outcome,) = batch
        log.error(
            "the outcome of job %s could not be stored (%s); recording it as failed",
            outcome.job.id,
            exc,
        )
        note = f"its outcome could not be stored: {type(exc).__name__}: {exc}"
        fallback = Outcome(
            outcome.job,
            "failed",
            outcome.duration,
            error={
                "attempt": outcome.job.attempt,
                "kind": "unstorable",
                "error": note.replace("\x00", "")[:2000],
                "traceback": "",
            },
        )
        try:
            await self._write_once([fallback])
        except psycopg.Error as final:
            # Left running: the rescuer applies the task's policy once this worker is gone.
            log.error(
                "job %s stays running: even its failure could not be stored: %s",
                outcome.job.id,
                final,
            )

    async def _write_once(self, batch: list[Outcome]) -> None:
        written = await self.link.run(
            lambda conn: self.store.finish_many(conn, batch, self.keep_history)
        )
        finished, retried = written.finished, written.retried
        moved = finished + retried
        self.written += moved
        self.retried += retried
        if moved < len(batch):
            log.warning(
                "%d of %d outcomes were not written: those jobs were moved by another actor "
                "(put back, rescued or finished elsewhere)",
                len(batch) - moved,
                len(batch),
            )
