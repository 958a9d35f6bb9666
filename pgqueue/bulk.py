"""Bulk enqueue through COPY: many plain jobs at close to COPY's speed.

Owns: which batches take COPY, and the batch rendered as COPY's text, each job's line
waiting for its id. pgqueue/store/jobs.py (copy_in) runs the three statements that store
it: ids are taken first, since COPY cannot return them, and come back in the order the jobs
were given, increasing, as from job_insert. On an autocommit connection the three run in a
transaction of their own; otherwise in the caller's, which is never committed here.

A batch takes COPY only when every job is a plain queued job: no dedupe key (that needs
job_insert_unique), no limits beyond the concurrency key, no run_at or delay (the status
depends on the server's clock), and only on a connection the caller does not hold in
pipeline mode. Others go through job_insert unchanged. Fails like job_insert, before any
row is sent: InvalidArgumentsError for a job whose arguments are not JSON or are over
max_payload_bytes, ConfigurationError for an atomic job with a concurrency key. The ids
taken by then become gaps, and the caller's transaction stays usable. Errors from the
server (a check constraint) leave nothing stored.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import pq

from pgqueue.codec import encode_args, too_large
from pgqueue.models import NewJob
from pgqueue.tenants import check_keyed_atomic

# Below this many jobs the three round trips cost more than job_insert's JSON batch saves.
COPY_MIN_JOBS = 64
# COPY's text format: these four characters are escaped in every field.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copyable(
    jobs: Sequence[NewJob], conn: psycopg.Connection[object] | psycopg.AsyncConnection[object]
) -> bool:
    """Whether this batch takes COPY on `conn`: not while the caller holds the connection in
    pipeline mode, where psycopg refuses COPY (job_insert takes the batch then)."""
    if len(jobs) < COPY_MIN_JOBS or conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return False
    for job in jobs:
        o = job.options
        if o.dedupe_key is not None or o.run_at is not None or o.delay or o.tags:
            return False
        if o.limits or o.fairness_key is not None:
            return False
    return True


@dataclass
class Batch:
    """A validated batch: each job's arguments and fixed fields, ready for its COPY line
    once its id is known, and each queue's lowest job."""

    args: list[str]
    fields: list[tuple[str, str]]  # per job: the fields before and after its arguments
    lowest: dict[str, tuple[int, int]]  # queue -> (priority, index of its first such job)

    @classmethod
    def of(cls, jobs: Sequence[NewJob], max_payload_bytes: int | None) -> Batch:
        """Raises InvalidArgumentsError or ConfigurationError for a bad job."""
        encoded: list[str] = []
        fields: list[tuple[str, str]] = []
        lowest: dict[str, tuple[int, int]] = {}
        # Jobs of one task share their options object: its fields are rendered once, and a
        # job holding the same options, task and atomic objects as the one before skips the
        # lookups, which matter at bulk sizes. Its queue's lowest job is then an earlier one.
        fixed: dict[tuple[int, str, bool], tuple[str, str]] = {}
        last_options, last_task, last_atomic, found = None, "", False, ("", "")
        limit = sys.maxsize if max_payload_bytes is None else max_payload_bytes
        for index, job in enumerate(jobs):
            args = encode_args(job)
            if len(args) > limit:
                raise too_large(index, job, len(args), limit)
            o = job.options
            if o is not last_options or job.task is not last_task or job.atomic is not last_atomic:
                last_options, last_task, last_atomic = o, job.task, job.atomic
                cached = fixed.get((id(o), job.task, job.atomic))
                if cached is None:
                    cached = fixed[id(o), job.task, job.atomic] = _fields(job)
                found = cached
                if o.queue not in lowest or o.priority < lowest[o.queue][0]:
                    lowest[o.queue] = (o.priority, index)  # ids grow with the index
            fields.append(found)
            # The encoder escapes every control character, so only backslashes need doubling.
            encoded.append(args.replace("\\", "\\\\"))
        return cls(encoded, fields, lowest)

    def copy_text(self, ids: Sequence[int], trace_context: str | None = None) -> str:
        """The lines of job_copy, or with `trace_context` (JSON text) those of
        job_copy_traced, the same on every line."""
        rows = zip(ids, self.fields, self.args, strict=True)
        end = "\n" if trace_context is None else f"\t{trace_context.translate(_ESCAPES)}\n"
        return "".join(f"{i}\t{head}\t{args}\t{tail}{end}" for i, (head, tail), args in rows)

    def wake_params(self, ids: Sequence[int]) -> dict[str, list[object]]:
        """job_wake's parameters: each queue's lowest (priority, id)."""
        return {
            "queues": list(self.lowest),
            "priorities": [p for p, _ in self.lowest.values()],
            "ids": [ids[i] for _, i in self.lowest.values()],
        }


def _fields(job: NewJob) -> tuple[str, str]:
    """The COPY fields before and after the arguments; checks the job's options."""
    o = job.options
    if job.atomic:
        check_keyed_atomic(job.task, o)
    key = "\\N" if o.concurrency_key is None else o.concurrency_key.translate(_ESCAPES)
    head = f"{o.queue.translate(_ESCAPES)}\t{job.task.translate(_ESCAPES)}"
    return head, f"{o.priority}\t{o.max_attempts}\t{'t' if job.atomic else 'f'}\t{key}"
