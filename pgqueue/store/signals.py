"""Signals: sending one, a job taking one, parking a job until one comes. Runs
sql/queries/signals.sql."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgqueue.models import ClaimedJob
from pgqueue.queries import query
from pgqueue.store.plan import Plan, one_as, rows_as
from pgqueue.store.steps import Recorded


@dataclass(frozen=True, slots=True)
class _Sent:
    """signal_send's row: the signal's id."""

    id: int


@dataclass(frozen=True, slots=True)
class _Taken:
    """A row of signal_take or signal_wait_timeout: the step's recorded result."""

    result: object


@dataclass(frozen=True, slots=True)
class _Wait:
    """A row of signal_wait_read: when the parked wait times out (None: never), the clock."""

    until: datetime | None
    now: datetime


def _lock(schema: str, key: str) -> Plan[None]:
    yield query("signal_lock", schema), {"schema": schema, "key": key}


def send_plan(schema: str, key: str, payload: str) -> Plan[int]:
    """Store a signal (its payload as JSON text) and wake the oldest job parked for its key;
    the signal's id. Its key's lock is held until the caller's transaction ends."""
    rows = yield query("signal_send", schema), {"key": key, "payload": payload}
    return one_as(_Sent, rows).id


def _step(job: ClaimedJob, seq: int, name: str, started_at: datetime) -> dict[str, object]:
    return {
        "job_id": job.id,
        "worker_id": job.worker_id,
        "attempt": job.attempt,
        "seq": seq,
        "name": name,
        "started_at": started_at,
    }


def take_plan(
    schema: str, job: ClaimedJob, seq: int, name: str, key: str, started_at: datetime
) -> Plan[Recorded | None]:
    """Take the oldest signal for `key` as the job's step `seq`: the step recorded (its
    result {"payload": ..., "sent_at": ...}), or None when there is none."""
    params = _step(job, seq, name, started_at) | {"key": key}
    taken = rows_as(_Taken, (yield query("signal_take", schema), params))
    return Recorded(seq, name, "signal", taken[0].result) if taken else None


def wait_read_plan(
    schema: str, job_id: int, seq: int
) -> Plan[tuple[datetime | None, datetime] | None]:
    """When the job's parked wait at `seq` times out (None: never) and the clock; None when
    it has not parked for it."""
    rows = yield query("signal_wait_read", schema), {"job_id": job_id, "seq": seq}
    waits = rows_as(_Wait, rows)
    return (waits[0].until, waits[0].now) if waits else None


def timeout_plan(
    schema: str, job: ClaimedJob, seq: int, name: str, started_at: datetime
) -> Plan[Recorded | None]:
    """Record the job's wait at `seq` as timed out; the step recorded, None if the job is
    no longer ours."""
    params = _step(job, seq, name, started_at)
    taken = rows_as(_Taken, (yield query("signal_wait_timeout", schema), params))
    return Recorded(seq, name, "signal", taken[0].result) if taken else None


def park_plan(
    schema: str,
    job: ClaimedJob,
    seq: int,
    key: str,
    timeout: float | None,
    longest: float,
) -> Plan[bool]:
    """Park the job until a signal for `key` or its timeout; False when it did not park (a
    signal is there, cancellation was requested, or the job is no longer ours)."""
    yield from _lock(schema, key)
    params = {
        "job_id": job.id,
        "worker_id": job.worker_id,
        "attempt": job.attempt,
        "seq": seq,
        "key": key,
        "timeout": timeout,
        "longest": longest,
    }
    rows = yield query("signal_park", schema), params
    return bool(rows)
