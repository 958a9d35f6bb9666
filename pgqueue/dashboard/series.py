"""The live charts' data: throughput, depth and claim latency, sampled as browsers ask.

Owns: a ring of samples kept in the dashboard's memory, at most one per SPACING, each read
from the hot jobs table (depth) and the workers' rows (their tallies, written by each
heartbeat). Throughput is the growth of the workers' tallies between two samples, so no
sample reads history.

Invariants: a worker first seen in a sample counts only if it started after the previous
one; otherwise its whole tally would look like a burst. A worker that stopped takes its
tally with it and counts nothing. The charts begin when the dashboard does.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from pgqueue import health
from pgqueue.store.plan import SyncConn
from pgqueue.store.workers import WorkerRow, WorkersStore

SPACING = 2.0  # seconds between samples, at most one per browser poll
KEEP = 900  # samples: half an hour at SPACING


@dataclass(frozen=True)
class Sample:
    at: float  # Unix time
    depth: dict[str, int]  # live jobs by status
    done_per_second: float
    failed_per_second: float
    claim_ms_p50: float | None  # the workers' recent median, weighted by worker


class Series:
    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.samples: deque[Sample] = deque(maxlen=KEEP)
        self._tallies: dict[int, dict[str, int]] = {}
        self._lock = threading.Lock()

    def read(self, conn: SyncConn) -> list[Sample]:
        """The samples so far, with a new one first if the last is older than SPACING."""
        with self._lock:
            now = time.time()
            if not self.samples or now - self.samples[-1].at >= SPACING:
                self.samples.append(self._sample(conn, now))
            return list(self.samples)

    def _sample(self, conn: SyncConn, now: float) -> Sample:
        depth: dict[str, int] = {}
        for row in health.queue_depth(conn, self.schema):
            depth[row.status] = depth.get(row.status, 0) + row.jobs
        workers = WorkersStore(self.schema).list(conn)
        previous = self.samples[-1].at if self.samples else None
        done, failed = self._growth(workers, previous)
        elapsed = now - previous if previous is not None else 0.0
        medians = [
            float(p)
            for w in workers
            if isinstance(p := (w.stats or {}).get("claim_ms_p50"), (int, float))
        ]
        return Sample(
            at=now,
            depth=depth,
            done_per_second=done / elapsed if elapsed > 0 else 0.0,
            failed_per_second=failed / elapsed if elapsed > 0 else 0.0,
            claim_ms_p50=sum(medians) / len(medians) if medians else None,
        )

    def _growth(self, workers: list[WorkerRow], previous: float | None) -> tuple[int, int]:
        done = failed = 0
        tallies: dict[int, dict[str, int]] = {}
        for w in workers:
            outcomes = _outcomes(w.stats)
            tallies[w.id] = outcomes
            before = self._tallies.get(w.id)
            if before is None:
                if previous is None or w.started_at.timestamp() < previous:
                    continue
                before = {}
            done += max(outcomes.get("succeeded", 0) - before.get("succeeded", 0), 0)
            failed += max(outcomes.get("failed", 0) - before.get("failed", 0), 0)
        self._tallies = tallies
        return done, failed


def _outcomes(stats: dict[str, object] | None) -> dict[str, int]:
    found = (stats or {}).get("outcomes")
    if not isinstance(found, dict):
        return {}
    return {str(k): v for k, v in found.items() if isinstance(v, int)}


def as_json(samples: list[Sample]) -> dict[str, Any]:
    """What the browser draws: one list per line, times in milliseconds."""
    statuses = sorted({s for sample in samples for s in sample.depth})
    return {
        "at": [int(s.at * 1000) for s in samples],
        "done_per_second": [round(s.done_per_second, 2) for s in samples],
        "failed_per_second": [round(s.failed_per_second, 2) for s in samples],
        "claim_ms_p50": [s.claim_ms_p50 for s in samples],
        "depth": {status: [s.depth.get(status, 0) for s in samples] for status in statuses},
    }
