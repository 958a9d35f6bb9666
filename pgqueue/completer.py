"""Writes job outcomes back in batches, one guarded statement per batch.

Owns: the outcomes the executor produced and not yet written. Each batch is one statement
(job_finish_many): finished jobs move to history (or are deleted when history is off),
retried jobs go back with their error. A row moves only while it is still running the same
attempt for this worker, so a late write never moves a job another actor has moved. On a
connection fault the batch is kept and written after reconnecting: an outcome is never dropped
while the worker lives.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from pgqueue.executor import Outcome
from pgqueue.link import Link
from pgqueue.queries import query

log = logging.getLogger("pgqueue.worker")


class Completer:
    def __init__(self, link: Link, schema: str, keep_history: bool, max_batch: int) -> None:
        self.link = link
        self.schema = schema
        self.keep_history = keep_history
        self.max_batch = max_batch
        self._pending: list[Outcome] = []
        self._ready = asyncio.Event()
        self._closing = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._writing: list[Outcome] = []
        self.written = 0
        self.retried = 0
        self.discarded = 0

    def add(self, outcome: Outcome) -> None:
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
        params = {
            "outcomes": json.dumps([o.as_row() for o in batch]),
            "keep_history": self.keep_history,
            "now": None,
        }

        async def write(conn: Any) -> tuple[int, int, int]:
            cur = await conn.execute(query("job_finish_many", self.schema), params)
            row = await cur.fetchone()
            return (int(row[0]), int(row[1]), int(row[2]))

        finished, retried, _archived = await self.link.run(write)
        moved = finished + retried
        self.written += moved
        self.retried += retried
        if moved < len(batch):
            self.discarded += len(batch) - moved
            log.warning(
                "%d of %d outcomes were not written: those jobs were moved by another actor "
                "(put back, rescued or finished elsewhere)",
                len(batch) - moved,
                len(batch),
            )
