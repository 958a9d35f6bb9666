"""Durable execution inside a task: recorded steps, durable sleeps and signals.

Owns: a job attempt's journal (the steps it recorded, read once, at its first durable call)
and the replay: the n-th durable call of a handler (`ctx.step`, `ctx.sleep`,
`ctx.wait_for_signal` and their async twins) returns what the n-th recorded one recorded,
without running again, or runs and records. The logic of each call is written once, as a
generator of effects (run a plan, call the function, end or roll back a segment) that a sync
and an async driver carry out (effects.py); the only place the twins differ.

Guarantees. A lease job's step records its result in a short transaction right after its
function returns (together with the records its worker's other jobs reach meanwhile), and
returns once it committed: at least once (a crash before the record runs it again), never
again once the record committed. An atomic job's handler runs in segments, each one
transaction on the job's connection that ends at a durable call: what the handler wrote
since the previous one commits together with the step's record; on a replay, what the handler
writes before each recorded call is rolled back, since it committed with that record the first
time. So every write an atomic handler makes on `ctx.connection` commits exactly once, as long
as the handler is deterministic between steps. Between segments the job is committed as
running for its worker, guarded by the worker's lease like a lease job: a dead worker's job is
rescued by its task's `on_lost` policy and replays from its last record. A sleep, a signal
taken and a wait that timed out are records like a step's; a job that parks for a signal
records nothing and rolls back its segment, which it runs again once woken. Where records
commit is pgqueue/worker/checkpoints.py.

Fails: StepMismatchError when the n-th call's name (or kind) differs from the n-th record,
StepResultError when a step returns what is not JSON, SignalTimeoutError when a wait times
out. A job that is no longer its worker's (rescued while it ran) stops at its next durable
call with JobLostError. Sleeping and parking stop the handler with a Snooze (Sleeping,
Parked): let them propagate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from pgqueue.codec import step_json
from pgqueue.errors import (
    ConfigurationError,
    PgQueueError,
    SignalTimeoutError,
    StepMismatchError,
    StepResultError,
)
from pgqueue.hooks import StepEvent
from pgqueue.models import LONGEST_WAIT, ClaimedJob, duration
from pgqueue.registry import CancelSignal, Snooze
from pgqueue.steps import KEY_MAX, check_label
from pgqueue.store.signals import park_plan, take_plan, timeout_plan, wait_read_plan
from pgqueue.store.steps import Journal, Recorded, StepRecord, read_plan, record_plan
from pgqueue.worker.checkpoints import Backend, JobLostError
from pgqueue.worker.effects import DISCARD, Call, End, Flow, Record, Run, adrive, drive
from pgqueue.worker.observe import Observers

T = TypeVar("T")


class CancelRequested(PgQueueError):
    """Cancellation of the job was requested: a `def` handler stops at its next durable
    call (an `async def` one is interrupted wherever it waits) and the job ends cancelled."""


class Sleeping(Snooze):
    """Raised by ctx.sleep: the job gives back its slot and runs again when the sleep ends."""


class Parked(Snooze):
    """Raised by ctx.wait_for_signal when the job parked: it is already rescheduled, so its
    outcome is not written again."""

    def __init__(self) -> None:
        super().__init__(0)


class Durable:
    """One attempt's durable calls: where the replay stands and where records go."""

    __slots__ = (
        "backend",
        "cancel",
        "job",
        "journal",
        "loaded_at",
        "max_bytes",
        "observers",
        "schema",
        "seq",
    )

    def __init__(
        self,
        job: ClaimedJob,
        schema: str,
        backend: Backend,
        max_bytes: int,
        cancel: CancelSignal | None = None,
        observers: Observers | None = None,
    ) -> None:
        """`observers` are told of each call (StepEvent), when given."""
        self.job = job
        self.observers = observers
        self.schema = schema
        self.backend = backend
        self.max_bytes = max_bytes
        self.cancel = cancel
        self.journal: Journal | None = None
        self.loaded_at = 0.0
        self.seq = 0

    # -- the drivers (effects.py) ---------------------------------------------------------

    def drive(self, flow: Flow[T]) -> T:
        """Carry out a flow's effects in this thread (a `def` handler)."""
        if self.cancel is not None and self.cancel.requested:
            raise CancelRequested(f"job {self.job.id}: cancellation was requested")
        return drive(flow, self.backend)

    async def adrive(self, flow: Flow[T]) -> T:
        """Carry out a flow's effects on the event loop (an `async def` handler)."""
        return await adrive(flow, self.backend)

    # -- what JobContext calls --------------------------------------------------------------

    def step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.drive(self.step_flow(check_label("step name", name), fn, args, kwargs))

    async def astep(
        self,
        name: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        return await self.adrive(self.step_flow(check_label("step name", name), fn, args, kwargs))

    def sleep(self, length: timedelta | float, name: str) -> None:
        self.drive(self.sleep_flow(check_label("sleep name", name), sleep_seconds(length), None))

    async def asleep(self, length: timedelta | float, name: str) -> None:
        flow = self.sleep_flow(check_label("sleep name", name), sleep_seconds(length), None)
        await self.adrive(flow)

    def sleep_until(self, when: datetime, name: str) -> None:
        self.drive(self.sleep_flow(check_label("sleep name", name), None, aware(when)))

    async def asleep_until(self, when: datetime, name: str) -> None:
        await self.adrive(self.sleep_flow(check_label("sleep name", name), None, aware(when)))

    def wait_for_signal(self, key: str, timeout: timedelta | float | None, name: str | None) -> Any:
        return self.drive(self._wait(key, timeout, name))

    async def await_for_signal(
        self, key: str, timeout: timedelta | float | None, name: str | None
    ) -> Any:
        return await self.adrive(self._wait(key, timeout, name))

    def _wait(self, key: str, timeout: timedelta | float | None, name: str | None) -> Flow[Any]:
        key = check_label("signal key", key, KEY_MAX)
        name = key if name is None else check_label("wait name", name)
        return self.wait_flow(key, name, timeout_seconds(timeout))

    # -- the calls --------------------------------------------------------------------------

    def step_flow(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Flow[Any]:
        """ctx.step: the recorded result, or run `fn` and record what it returns."""
        recorded = yield from self._expect(name, "step")
        if recorded is not None:
            yield DISCARD
            return recorded.result
        seq, started, clock = self.seq, _now(), time.monotonic()
        self._tell(seq, name, "step", "started")
        try:
            value = yield Call(fn, args, kwargs)
            try:
                encoded = step_json(value, self.max_bytes)
            except ValueError as exc:
                raise StepResultError(
                    f"job {self.job.id}: step {seq} {name!r} returned a result that cannot be "
                    f"recorded: {exc}; return JSON (dicts, lists, strings, numbers, booleans, "
                    "None)"
                ) from None
            step = Recorded(seq, name, "step", None)
            found = yield self._record(StepRecord(self.job, step, started, encoded))
            done = self._settled(found, step)
        except BaseException as exc:
            took = time.monotonic() - clock
            self._tell(seq, name, "step", "failed", duration=took, error=exc)
            raise
        self._tell(seq, name, "step", "recorded", duration=time.monotonic() - clock)
        yield End(True)
        return done.result

    def sleep_flow(self, name: str, seconds: float | None, until: datetime | None) -> Flow[None]:
        """ctx.sleep / ctx.sleep_until: record when the sleep ends, then stop the handler
        (Sleeping) until then; once it has ended, go on."""
        recorded = yield from self._expect(name, "sleep")
        if recorded is None:
            seq, started = self.seq, _now()
            step = Recorded(seq, name, "sleep", None)
            encoded = None if until is None else _until_json(until)
            found = yield self._record(StepRecord(self.job, step, started, encoded, seconds))
            recorded = self._settled(found, step)
            now = found[1]
            self._tell(seq, name, "sleep", "recorded", until=_until_at(recorded))
            yield End(True)
        else:
            yield DISCARD
            assert self.journal is not None
            now = self.journal.now + timedelta(seconds=time.monotonic() - self.loaded_at)
        left = _until(recorded) - now.timestamp()
        if left > 0:
            self._tell(recorded.seq, name, "sleep", "sleeping", until=_until_at(recorded))
            raise Sleeping(min(left, LONGEST_WAIT.total_seconds()))

    def wait_flow(self, key: str, name: str, timeout: float | None) -> Flow[Any]:
        """ctx.wait_for_signal: a signal's payload, taken once; or park the job until one
        comes (Parked), or raise SignalTimeoutError once its timeout has passed."""
        recorded = yield from self._expect(name, "signal")
        if recorded is not None:
            yield DISCARD
            return _delivered(recorded, key)
        seq, started, job, schema = self.seq, _now(), self.job, self.schema
        taken = yield Run(lambda: take_plan(schema, job, seq, name, key, started))
        if taken is not None:
            self._tell(seq, name, "signal", "recorded", key=key)
            yield End(True)
            return _delivered(taken, key)
        wait = yield Run(lambda: wait_read_plan(schema, job.id, seq))
        if wait is not None and wait[0] is not None and wait[0] <= wait[1]:
            timed_out = yield Run(lambda: timeout_plan(schema, job, seq, name, started))
            if timed_out is None:
                raise JobLostError(f"job {job.id} is no longer this worker's")
            self._tell(seq, name, "signal", "timed out", key=key, until=wait[0])
            yield End(True)
            return _delivered(timed_out, key)
        # Parking rolls back what the handler wrote since its last record: the job runs this
        # part again once the signal is there, and records the wait then.
        yield DISCARD
        longest = LONGEST_WAIT.total_seconds()
        parked = yield Run(lambda: park_plan(schema, job, seq, key, timeout, longest))
        yield End(not parked)
        if parked:
            until = None if timeout is None else _now() + timedelta(seconds=timeout)
            if wait is not None:
                until = wait[0]  # parked again for the same wait: its first deadline holds
            self._tell(seq, name, "signal", "parked", key=key, until=until)
            raise Parked
        # Not parked: a signal came meanwhile, cancellation was requested, or the job is not
        # ours. Run again at once: the next attempt takes the signal (or ends as cancelled).
        raise Snooze(0)

    def _record(self, record: StepRecord) -> Record:
        return Record(lambda: record_plan(self.schema, record), record)

    # -- the replay -------------------------------------------------------------------------

    def _expect(self, name: str, kind: str) -> Flow[Recorded | None]:
        """The next call's record, if the job made one; StepMismatchError if it was made
        under another name or kind."""
        if self.journal is None:
            job_id, schema = self.job.id, self.schema
            self.journal = yield Run(lambda: read_plan(schema, job_id))
            self.loaded_at = time.monotonic()
        self.seq += 1
        steps = self.journal.steps
        if self.seq > len(steps):
            return None
        recorded = steps[self.seq - 1]
        if recorded.seq != self.seq or recorded.name != name or recorded.kind != kind:
            raise self._mismatch(recorded, name, kind)
        self._tell(self.seq, name, kind, "replayed")
        return recorded

    def _tell(self, seq: int, name: str, kind: str, what: str, **more: Any) -> None:
        """Tell the worker's observers what a call did (pgqueue/worker/observe.py)."""
        if self.observers is not None:
            self.observers.step_event(StepEvent(self.job, seq, name, kind, what, **more))

    def _mismatch(self, recorded: Recorded, name: str, kind: str) -> StepMismatchError:
        self._tell(self.seq, name, kind, "mismatch")
        return StepMismatchError(
            f"job {self.job.id} ({self.job.task}): durable call {self.seq} is "
            f"{_call(kind, name)} but the job recorded {_call(recorded.kind, recorded.name)} "
            "there: the task's steps were renamed, removed or reordered since the job "
            "started. The job fails rather than replay results into the wrong steps; "
            "enqueue it again to start afresh"
        )

    def _settled(self, found: tuple[Recorded, datetime] | None, step: Recorded) -> Recorded:
        """The record a record_plan left: ours, or one already there under the same name
        (this attempt's earlier try, or another worker's run)."""
        if found is None:
            raise JobLostError(
                f"job {self.job.id} is no longer this worker's: step {step.seq} "
                f"{step.name!r} was not recorded"
            )
        recorded = found[0]
        if recorded.name != step.name or recorded.kind != step.kind:
            raise self._mismatch(recorded, step.name, step.kind)
        return recorded


def sleep_seconds(value: timedelta | float) -> float:
    """A sleep's length in seconds: 0 to LONGEST_WAIT."""
    wait = duration(value, "sleep")
    if wait is None or not timedelta(0) <= wait <= LONGEST_WAIT:
        raise ConfigurationError(
            f"sleep({value!r}): give 0 to {LONGEST_WAIT.days} days, as seconds or a timedelta"
        )
    return wait.total_seconds()


def timeout_seconds(value: timedelta | float | None) -> float | None:
    """A wait's timeout in seconds, or None (wait as long as it takes)."""
    if value is None:
        return None
    wait = duration(value, "timeout")
    if wait is None or not timedelta(0) <= wait <= LONGEST_WAIT:
        raise ConfigurationError(
            f"timeout={value!r}: give 0 to {LONGEST_WAIT.days} days, as seconds or a "
            "timedelta, or None"
        )
    return wait.total_seconds()


def aware(when: datetime) -> datetime:
    """A sleep's end: a timezone-aware datetime."""
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise ConfigurationError(
            f"sleep_until({when!r}): give a timezone-aware datetime "
            "(datetime.now(timezone.utc) + ...)"
        )
    return when


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _until_json(until: datetime) -> str:
    return json.dumps({"until": until.isoformat(), "until_epoch": until.timestamp()})


def _until(recorded: Recorded) -> float:
    """When a recorded sleep ends, in seconds since the epoch."""
    result = recorded.result
    if isinstance(result, dict) and isinstance(result.get("until_epoch"), (int, float)):
        return float(result["until_epoch"])
    if isinstance(result, dict) and isinstance(result.get("until"), str):
        return datetime.fromisoformat(result["until"]).timestamp()
    raise StepMismatchError(f"sleep {recorded.name!r} recorded no end: {result!r}")


def _until_at(recorded: Recorded) -> datetime:
    return datetime.fromtimestamp(_until(recorded), timezone.utc)


def _delivered(recorded: Recorded, key: str) -> Any:
    """A recorded wait's payload, or SignalTimeoutError for one that timed out."""
    result = recorded.result
    if isinstance(result, dict) and "payload" in result:
        return result["payload"]
    raise SignalTimeoutError(f"no signal {key!r} came within the wait's timeout")


def _call(kind: str, name: str) -> str:
    what = {"step": "step", "sleep": "sleep", "signal": "wait for signal"}.get(kind, kind)
    return f"{what} {name!r}"
