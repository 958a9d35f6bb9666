"""Settings, options and records, as pydantic models and enums. No I/O here.

Settings are validated once, at construction: an impossible value raises ConfigurationError
naming the setting and its allowed range, before anything starts.
"""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    computed_field,
    field_validator,
    model_validator,
)
from typing_extensions import TypeVar

from pgqueue.errors import ConfigurationError

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,254}$")
SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
PRIORITY_MIN, PRIORITY_MAX = -100, 100
MAX_ATTEMPTS_LIMIT = 1000
DEDUPE_KEY_MAX = 512

MIN_RETENTION, MAX_RETENTION = timedelta(minutes=1), timedelta(days=36_500)
# The longest wait a job may be given (delay, run_at ahead, retry backoff, dedupe window,
# timeout): far beyond any real schedule, and short enough that every time computed from one
# stays within what Python and PostgreSQL both represent.
LONGEST_WAIT = timedelta(days=3650)
# Worker intervals and grace periods: a value past these is a typo (seconds for ms), never a
# plan, and would leave a worker that never polls, never renews its lease, or never stops.
LONGEST_INTERVAL = timedelta(hours=1)
LONGEST_LEASE = timedelta(days=1)
# A claim held back longer than this would be latency no batching repays.
LONGEST_COOLDOWN = timedelta(seconds=1)
CONCURRENCY_KEY = re.compile(r"^(?!\*$)[^\x00]{1,255}$", re.DOTALL)
TAG = re.compile(r"^[^\x00]{1,128}$", re.DOTALL)
MAX_TAGS = 32
MAX_LIMIT_KEYS = 16


_NAME_RULES = {
    QUEUE_NAME.pattern: "1-128 letters, digits and _ . : -, starting with a letter or digit",
    TASK_NAME.pattern: "1-255 letters, digits and _ . : -, starting with a letter or _",
    SCHEMA_NAME.pattern: "1-63 letters, digits and _, starting with a letter or _",
}


def one_of(value: str, allowed: Sequence[str], field: str) -> str:
    """For a validator: `value` if it is one of `allowed`, else the ValueError naming them."""
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}")
    return value


def matching(value: str, pattern: re.Pattern[str], what: str) -> str:
    """For a validator: `value` if it matches `pattern`, else the ValueError saying so."""
    if not pattern.fullmatch(value):
        raise ValueError(f"{what} must match {pattern.pattern}")
    return value


def check_identifier(kind: str, value: str, pattern: re.Pattern[str]) -> str:
    """A task's, queue's or schema's name: `value` if it matches `pattern` (the identifier
    rules above), else ConfigurationError naming the rule. Step names and signal keys are
    free text, checked by steps.check_label."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        rule = _NAME_RULES.get(pattern.pattern, f"it must match {pattern.pattern}")
        raise ConfigurationError(f"invalid {kind} name {value!r}: {rule}")
    return value


def _one_of(allowed: Sequence[str], field: str) -> AfterValidator:
    return AfterValidator(lambda value: one_of(value, allowed, field))


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    return AfterValidator(lambda value: matching(value, pattern, what))


QueueName = Annotated[str, _matching(QUEUE_NAME, "queue names")]
SchemaName = Annotated[str, _matching(SCHEMA_NAME, "schema names")]


# An atomic job holds a transaction for its whole run, which holds back VACUUM: its time is
# always bounded, by default and at most by these.
ATOMIC_DEFAULT_TIMEOUT = timedelta(seconds=60)
ATOMIC_MAX_TIMEOUT = timedelta(minutes=15)
# How long after its claim a job claimed under rate limits (a queue's, a task's or a key's)
# may still start: each limit counts the starts of a period and this margin back
# (job_claim_rated, job_rate_admit), so it holds at handlers' starts.
# Wider costs a limit's backlog some rate (a period and this margin between two full
# windows); narrower puts back more jobs that a busy worker could not start in time.
RATE_START_MARGIN = timedelta(milliseconds=100)


# The fixed sets of strings the public API takes, for a type checker; the validators below
# check the same sets at run time (tests/unit/test_typed_tasks.py keeps the two equal).
OnLost = Literal["retry", "fail", "abandon", "compensate"]
"""`on_lost` of a task: what happens to a job whose worker died (TaskPolicy)."""
Missed = Literal["skip", "run_once"]
"""`missed` of a recurring job: what happens to ticks no worker enqueued in time."""
StatusName = Literal[
    "queued", "scheduled", "running", "succeeded", "failed", "cancelled", "waiting", "blocked"
]
"""A job status as a string, as list_jobs(status=...) takes it beside JobStatus."""


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"  # queued, but its concurrency key is at its limit
    BLOCKED = "blocked"  # waits for the jobs it depends on to finish (a workflow)


class Settings(BaseModel):
    """Base for settings: frozen, no unknown keys, errors turned into ConfigurationError."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigurationError(_describe(type(self).__name__, exc)) from None


def _describe(model: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a rule across several settings: the message names them
            parts.append(message)
            continue
        field = ".".join(str(p) for p in err["loc"])
        parts.append(f"{field}={err.get('input')!r}: {message}")
    return f"invalid {model}: " + "; ".join(parts)


def _positive(value: timedelta, name: str, longest: timedelta = LONGEST_WAIT) -> timedelta:
    if value <= timedelta(0):
        raise ValueError(f"{name} must be greater than 0 seconds")
    return _at_most(value, name, longest)


def _at_most(value: timedelta, name: str, longest: timedelta = LONGEST_WAIT) -> timedelta:
    if value > longest:
        raise ValueError(f"{name} must be at most {_span(longest)}")
    return value


def duration(value: timedelta | float | None, name: str) -> timedelta | None:
    """A duration given as a timedelta or as seconds; a number no timedelta can hold (1e300,
    nan) is a ConfigurationError naming the setting, not an OverflowError."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name}={value!r}: give seconds or a timedelta")
    try:
        return timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise ConfigurationError(
            f"{name}={value!r} seconds is out of range: at most {_span(LONGEST_WAIT)}"
        ) from None


def _span(value: timedelta) -> str:
    return f"{value.days} days" if value.days else f"{value.total_seconds():g} seconds"


class RetryPolicy(Settings):
    """Exponential backoff with jitter: base * 2**(attempt-1), capped, times 1 ± jitter."""

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(hours=1)
    jitter: float = Field(default=0.25, ge=0.0, le=1.0)

    if TYPE_CHECKING:  # durations as seconds too, as pydantic accepts them at run time

        def __init__(
            self,
            *,
            base: timedelta | float = ...,
            cap: timedelta | float = ...,
            jitter: float = ...,
        ) -> None: ...

    @field_validator("base", "cap")
    @classmethod
    def _within_range(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        if value < timedelta(0):
            raise ValueError(f"{info.field_name} must be 0 seconds or more")
        return _at_most(value, str(info.field_name))

    def delay(self, attempt: int, rng: random.Random | None = None) -> timedelta:
        """Delay before the retry that follows failed attempt number `attempt` (1-based)."""
        exponent = min(max(attempt - 1, 0), 40)
        # In float seconds: base * 2**40 overflows a timedelta long before the cap applies.
        raw = min(self.base.total_seconds() * 2**exponent, self.cap.total_seconds())
        spread = (rng or random).uniform(1 - self.jitter, 1 + self.jitter)
        return timedelta(seconds=raw * spread)


LOST_POLICIES = ("retry", "fail", "abandon", "compensate")
LostPolicy = Annotated[str, _one_of(LOST_POLICIES, "on_lost")]


class TaskPolicy(Settings):
    """What happens to a task's jobs when they fail, run too long, or lose their worker.

    on_lost applies when the worker running a job dies: its database session ended (crash,
    kill -9), or it stopped heartbeating for the lease (lost host, hang): `retry` (counts the
    attempt, backoff as for failures), `fail`, `abandon` (fail and notify the dead-job
    channel), or `compensate` (fail and enqueue `compensate_with`).
    """

    retry: RetryPolicy = RetryPolicy()
    timeout: timedelta | None = None
    on_lost: LostPolicy = "retry"
    compensate_with: str | None = None

    @field_validator("timeout")
    @classmethod
    def _timeout_positive(cls, value: timedelta | None) -> timedelta | None:
        return None if value is None else _positive(value, "timeout")

    @model_validator(mode="after")
    def _compensation_named(self) -> TaskPolicy:
        if (self.on_lost == "compensate") != (self.compensate_with is not None):
            raise ValueError("compensate_with names the task to enqueue iff on_lost='compensate'")
        return self


class JobOptions(Settings):
    """Per-job options; a task's defaults, overridden per enqueue."""

    queue: QueueName = "default"
    priority: int = Field(default=0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    max_attempts: int = Field(default=25, ge=1, le=MAX_ATTEMPTS_LIMIT)
    run_at: datetime | None = None
    delay: timedelta | None = None
    dedupe_key: str | None = Field(default=None, min_length=1, max_length=DEDUPE_KEY_MAX)
    dedupe_window: timedelta | None = None

    @field_validator("dedupe_key")
    @classmethod
    def _dedupe_key_storable(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("dedupe_key cannot contain a NUL character (\\x00)")
        return value

    @field_validator("dedupe_window")
    @classmethod
    def _dedupe_window_positive(cls, value: timedelta | None) -> timedelta | None:
        return None if value is None else _positive(value, "dedupe_window")

    concurrency_key: str | None = None

    @field_validator("concurrency_key")
    @classmethod
    def _concurrency_key(cls, value: str | None) -> str | None:
        if value is not None and not CONCURRENCY_KEY.fullmatch(value):
            raise ValueError(
                "a concurrency key is 1-255 characters without NUL, and not '*' (the default)"
            )
        return value

    limits: tuple[str, ...] | None = None

    @field_validator("limits", mode="before")
    @classmethod
    def _limits(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = (value,)
        keys = tuple(dict.fromkeys(value))  # each once, in the order given
        if len(keys) > MAX_LIMIT_KEYS or not all(
            isinstance(k, str) and CONCURRENCY_KEY.fullmatch(k) for k in keys
        ):
            raise ValueError(
                f"limits are up to {MAX_LIMIT_KEYS} keys of 1-255 characters without NUL, "
                "and not '*' (the default)"
            )
        return keys or None

    fairness_key: str | None = None

    @field_validator("fairness_key")
    @classmethod
    def _fairness_key(cls, value: str | None) -> str | None:
        if value is not None and not CONCURRENCY_KEY.fullmatch(value):
            raise ValueError("a fairness key is 1-255 characters without NUL, and not '*'")
        return value

    # On a Citus cluster, the job's distribution value (pgqueue.citus): a value, or a template
    # such as "{tenant_id}" filled from the job's arguments. Plain PostgreSQL ignores it.
    shard_key: str | None = None

    @field_validator("shard_key")
    @classmethod
    def _shard_key(cls, value: str | None) -> str | None:
        if value is not None and not CONCURRENCY_KEY.fullmatch(value):
            raise ValueError("a shard key is 1-255 characters without NUL, and not '*'")
        return value

    tags: tuple[str, ...] | None = None

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = (value,)
        tags = tuple(dict.fromkeys(value))  # each once, in the order given
        if len(tags) > MAX_TAGS or not all(isinstance(t, str) and TAG.fullmatch(t) for t in tags):
            raise ValueError(f"tags are up to {MAX_TAGS} strings of 1-128 characters without NUL")
        return tags or None

    @field_validator("delay")
    @classmethod
    def _delay_in_range(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("delay must be 0 seconds or more; use run_at for a fixed time")
        return None if value is None else _at_most(value, "delay")

    @field_validator("run_at")
    @classmethod
    def _run_at_in_range(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
        if value - datetime.now(timezone.utc) > LONGEST_WAIT:
            raise ValueError(f"run_at must be at most {_span(LONGEST_WAIT)} from now")
        return value

    def merged(self, overrides: dict[str, Any]) -> JobOptions:
        """These options with those of one enqueue (or with_options) on top. A time given
        there replaces the inherited one: run_at drops an inherited delay, and delay an
        inherited run_at. Both at once, or a dedupe_window with no dedupe_key for it to apply
        to, is a ConfigurationError: either would otherwise be ignored without a word."""
        if overrides.get("run_at") is not None and overrides.get("delay") is not None:
            raise ConfigurationError(
                "give delay (seconds from now) or run_at (a time), not both: one would be ignored"
            )
        inherited = self.model_dump(exclude_none=True)
        if overrides.get("run_at") is not None:
            inherited.pop("delay", None)
        if overrides.get("delay") is not None:
            inherited.pop("run_at", None)
        options = JobOptions(**(inherited | overrides))
        if overrides.get("dedupe_window") is not None and options.dedupe_key is None:
            raise ConfigurationError(
                "dedupe_window applies to jobs enqueued with a dedupe_key: pass dedupe_key= "
                "with it (or set the window on the task, for the keys its jobs get later)"
            )
        return options


class QueueSettings(Settings):
    """Settings shared by the enqueueing side and workers."""

    schema_name: SchemaName = Field(default="pgqueue", alias="schema")
    keep_history: bool = True
    max_payload_bytes: int = Field(default=10 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    # Server-side prepared statements on the queue's own connections; off behind PgBouncer's
    # transaction pooling, whose server connections change from one transaction to the next.
    prepare: bool = True

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


ALL_QUEUES = "*"  # as WorkerSettings.queues: every queue the worker's application knows


class WorkerSettings(Settings):
    """How a worker claims, runs and stops. Durations accept seconds or timedeltas.
    queues=("*",) serves every queue the application's tasks name, and "default"
    (Registry.queues: those of an integration's tasks too, such as django.tasks')."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = Field(default=10, ge=1, le=10_000)
    batch_size: int = Field(default=100, ge=1, le=10_000)
    poll_interval: timedelta = timedelta(seconds=1)
    poll_only: bool = False
    # While work keeps arriving, claim at most once per cooldown, so the jobs committed in the
    # meantime come in one claim and finish in one statement; the first claim after a quiet
    # spell, and one after a claim that came back full, are never held back.
    claim_cooldown: timedelta = timedelta(milliseconds=2)
    hint_reset_interval: timedelta = timedelta(seconds=10)
    hint_reset_jitter: float = Field(default=0.5, ge=0.0, le=1.0)
    # How long every slot must have been busy before the worker stops asking for wake-ups of
    # jobs its next claim finds anyway; None: it always asks, and every enqueue notifies.
    quiet_after: timedelta | None = timedelta(seconds=1)
    shutdown_grace: timedelta = timedelta(seconds=30)
    heartbeat_interval: timedelta = timedelta(seconds=5)
    lease_timeout: timedelta = timedelta(seconds=30)
    rescue_interval: timedelta = timedelta(seconds=10)
    promote_batch: int = Field(default=1000, ge=1, le=100_000)
    atomic_concurrency: int = Field(default=2, ge=0, le=100)
    horizon_warning: timedelta = timedelta(minutes=5)
    burst: bool = False
    name: str | None = None
    periodic: bool = True
    history_retention: timedelta | None = None
    prune_interval: timedelta = timedelta(minutes=10)
    prune_batch: int = Field(default=1000, ge=10, le=100_000)

    @field_validator("history_retention")
    @classmethod
    def _retention_in_range(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and not MIN_RETENTION <= value <= MAX_RETENTION:
            raise ValueError(
                f"history_retention must be from {MIN_RETENTION} to {MAX_RETENTION.days} days "
                "(or None to keep history forever; Queue(keep_history=False) keeps none)"
            )
        return value

    @field_validator("quiet_after")
    @classmethod
    def _quiet_after_in_range(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and not timedelta(0) <= value <= LONGEST_INTERVAL:
            raise ValueError(
                f"quiet_after must be from 0 seconds to {LONGEST_INTERVAL} "
                "(or None to be woken by every enqueue)"
            )
        return value

    @field_validator("claim_cooldown")
    @classmethod
    def _cooldown_in_range(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= LONGEST_COOLDOWN:
            raise ValueError(
                f"claim_cooldown must be from 0 seconds (claim on every wake-up) to "
                f"{LONGEST_COOLDOWN.total_seconds():g} seconds"
            )
        return value

    @field_validator("prune_interval")
    @classmethod
    def _prune_interval_in_range(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=1) <= value <= timedelta(days=1):
            raise ValueError("prune_interval must be from 1 second to 1 day")
        return value

    @field_validator("queues")
    @classmethod
    def _queue_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value == (ALL_QUEUES,):
            return value
        if not value:
            raise ValueError("at least one queue is needed")
        for name in value:
            if not QUEUE_NAME.fullmatch(name):
                raise ValueError(f"queue name {name!r} must match {QUEUE_NAME.pattern}")
        if len(set(value)) != len(value):
            raise ValueError("queue names must be distinct")
        return value

    @model_validator(mode="after")
    def _lease_outlasts_heartbeats(self) -> WorkerSettings:
        if self.lease_timeout < 2 * self.heartbeat_interval:
            raise ValueError(
                "lease_timeout must be at least 2 x heartbeat_interval, or live workers "
                "would lose their jobs between two heartbeats"
            )
        return self

    @field_validator(
        "poll_interval",
        "hint_reset_interval",
        "heartbeat_interval",
        "rescue_interval",
    )
    @classmethod
    def _interval_in_range(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        return _positive(value, str(info.field_name), LONGEST_INTERVAL)

    @field_validator("lease_timeout", "horizon_warning")
    @classmethod
    def _lease_in_range(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        return _positive(value, str(info.field_name), LONGEST_LEASE)

    @field_validator("shutdown_grace")
    @classmethod
    def _grace_in_range(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("shutdown_grace must be 0 seconds or more")
        return _at_most(value, "shutdown_grace", LONGEST_LEASE)


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as a worker holds it while running it. Plain data: built once per job."""

    id: int
    task: str
    args: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    queue: str
    worker_id: int
    # The enqueuer's trace context (pgqueue/tracing.py), when tracing was on where it was
    # enqueued; None otherwise, and for jobs a rescuer holds.
    trace_context: dict[str, Any] | None = None
    # Seconds from when it was due (run_at) to this attempt's start: its wait in the queue.
    waited: float | None = None
    # The time.monotonic() by which its handler must start, or the job is put back: rate
    # limits count on handlers starting within a margin of their claim. None: any time.
    start_by: float | None = None
    # Claimed by the claim that takes only jobs with no concurrency or limit key: its outcome
    # has no key's slot to lock. False wherever that is not known.
    unkeyed: bool = False


class Job(BaseModel):
    """A job's record, from the hot table or, once finished, from history (Queue.get_job,
    Queue.list_jobs). Times are timezone-aware; durations are timedeltas (None until known).

    An atomic job shows as `queued` while it runs: its claim commits with its completion, or
    with its first durable step (JobContext.step), from which on it shows as `running`.
    """

    model_config = ConfigDict(frozen=True)

    id: int = Field(description="the job's id, as enqueue returned it")
    queue: str = Field(description="the queue it runs on")
    task: str = Field(description="the registered task name")
    args: dict[str, Any] = Field(description="its arguments, as stored (JSON)")
    status: JobStatus = Field(
        description="queued, scheduled (waiting for run_at), running, or finally "
        "succeeded, failed or cancelled"
    )
    priority: int = Field(description="-100..100, lower runs first")
    attempt: int = Field(description="attempts started so far (0 while never started)")
    max_attempts: int = Field(description="attempts allowed before the job fails")
    run_at: datetime = Field(description="not run before this time")
    created_at: datetime = Field(description="when it was enqueued")
    started_at: datetime | None = Field(description="start of the latest attempt")
    finished_at: datetime | None = Field(description="when it succeeded, failed or was cancelled")
    worker_id: int | None = Field(description="the worker running it, or that ran it last")
    errors: list[dict[str, Any]] = Field(
        description='each failed attempt: {"attempt", "at", "kind", "error", "traceback"}, '
        'and the exception\'s "type" (module.qualname) and the "worker" id when the handler '
        "raised"
    )
    result: Any = Field(default=None, description="the handler's return value (JSON), if any")
    dedupe_key: str | None = Field(default=None, description="the dedupe key it was enqueued with")
    retry_of: int | None = Field(default=None, description="the job this one re-runs (retry)")
    cancel_requested_at: datetime | None = Field(
        default=None, description="when cancellation of the running job was requested"
    )
    atomic: bool = Field(default=False, description="claim, run and completion in one transaction")
    concurrency_key: str | None = Field(
        default=None, description="the tenant or other key whose concurrency limit it counts in"
    )
    workflow_id: int | None = Field(
        default=None,
        description="the workflow it belongs to (Queue.get_workflow), or that waits for it",
    )
    progress: dict[str, Any] | None = Field(
        default=None,
        description='what the handler last reported: {"fraction", "message", "meta", "at"}',
    )
    tags: list[str] = Field(default_factory=list, description="labels given at enqueue")
    limit_keys: list[str] = Field(
        default_factory=list,
        description="its other limit keys (limits=), each with a limit it counts in",
    )
    fairness_key: str | None = Field(
        default=None, description="the key (usually a tenant) whose fair share it is served in"
    )

    @field_validator("tags", "limit_keys", mode="before")
    @classmethod
    def _no_tags(cls, value: Any) -> Any:
        return [] if value is None else value

    @computed_field  # type: ignore[prop-decorator]
    @property
    def last_error(self) -> str | None:
        """The error of the latest failed attempt, as `Type: message`."""
        return str(self.errors[-1].get("error")) if self.errors else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def wait_time(self) -> timedelta | None:
        """Queue wait: from creation (or run_at, if later) to the start of the last attempt.
        None before the first start, and while the job waits for a retry: run_at is then the
        next attempt's, and the last attempt's own due time is no longer known."""
        if self.started_at is None or self.run_at > self.started_at:
            return None
        return self.started_at - max(self.created_at, self.run_at)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def run_time(self) -> timedelta | None:
        """Run time of the last attempt: from its start to the finish."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES


FINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


StepState = Literal["recorded", "sleep", "signal wait", "timed out"]


class JobStep(BaseModel):
    """One durable call a job recorded (JobContext.step, sleep, wait_for_signal), in the
    order its handler reached it (Queue.job_steps)."""

    model_config = ConfigDict(frozen=True)

    seq: int = Field(description="its place among the job's durable calls, from 1")
    name: str = Field(description="the step's name; a sleep's, or a wait's (its key by default)")
    kind: Literal["step", "sleep", "signal"] = Field(description="what recorded it")
    result: Any = Field(
        default=None,
        description="what it recorded (JSON): a step's result, a sleep's {\"until\"}, a "
        'signal\'s {"payload", "sent_at"}, or {"timeout": true} for a wait that timed out',
    )
    started_at: datetime | None = Field(default=None, description="when the call began")
    finished_at: datetime = Field(description="when it was recorded")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def state(self) -> StepState:
        """recorded (a step's result), sleep, signal wait (a signal taken) or timed out (a
        wait whose timeout passed first)."""
        if self.kind == "step":
            return "recorded"
        if self.kind == "sleep":
            return "sleep"
        if isinstance(self.result, dict) and self.result.get("timeout"):
            return "timed out"
        return "signal wait"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def duration(self) -> timedelta | None:
        """From the call's start to its record; for a wait, how long until its signal."""
        return None if self.started_at is None else self.finished_at - self.started_at

    @property
    def sleeps_until(self) -> datetime | None:
        """When a sleep ends; None for another kind."""
        found = self.result.get("until") if isinstance(self.result, dict) else None
        if self.kind != "sleep" or not isinstance(found, str):
            return None
        return datetime.fromisoformat(found)


class JobSteps(BaseModel):
    """A job's durable calls, and what it waits for now (Queue.job_steps): `sleeping_until`
    while it sleeps (ctx.sleep), `waiting_for` and `waiting_until` while it is parked for a
    signal (ctx.wait_for_signal; `waiting_until` None: no timeout). Steps stay with a
    finished job in history until retention prunes it."""

    model_config = ConfigDict(frozen=True)

    job_id: int = Field(description="the job's id")
    steps: list[JobStep] = Field(description="its recorded calls, in order")
    sleeping_until: datetime | None = Field(
        default=None, description="while the job sleeps, when the sleep ends"
    )
    waiting_for: str | None = Field(
        default=None, description="while the job is parked for a signal, the signal's key"
    )
    waiting_until: datetime | None = Field(
        default=None, description="while parked, when the wait times out (None: never)"
    )
    waiting_since: datetime | None = Field(default=None, description="while parked, since when")

    @property
    def waiting(self) -> str | None:
        """What the job waits for, said for a person: "sleep" or "signal"; None if neither."""
        if self.waiting_for is not None:
            return "signal"
        return "sleep" if self.sleeping_until is not None else None


# What a job's handler returns, for a type checker only: NewJob[T] and Enqueued[T] carry it
# from the task to `queue.wait(...)`, which returns a T. Covariant: both are read-only. Its
# default keeps a bare `Enqueued` or `NewJob` annotation, as written before they were
# generic, valid under mypy --strict (typing_extensions: pydantic's own dependency).
T_co = TypeVar("T_co", covariant=True, default=Any)


class Enqueued(int, Generic[T_co]):
    """The id of an enqueued job (an int, as before), and whether this call created it.

    `created` is False when a dedupe key resolved to an existing job: one still queued,
    scheduled or running, or one finished within the dedupe window.

    For a type checker it is `Enqueued[T]`, T what the task's handler returns (awaited, for
    an `async def` one), so `queue.wait(...)` on it is a T; a bare `Enqueued` is
    `Enqueued[Any]`.
    """

    # A class default: the ids that were created (nearly all) carry no instance dict, which
    # was half the cost of returning a bulk enqueue's ids.
    created: bool = True

    def __new__(cls, job_id: int, created: bool = True) -> Enqueued[Any]:
        self = int.__new__(cls, job_id)
        if not created:
            self.created = False
        return self

    @property
    def id(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"Enqueued(id={int(self)}, created={self.created})"

    __str__ = int.__repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (Enqueued, (int(self), self.created))


class JobPage(BaseModel):
    """One page of Queue.list_jobs, newest first. Pass `next_before_id` as `before_id` to get
    the next page; it is None on the last page."""

    model_config = ConfigDict(frozen=True)

    jobs: list[Job]
    next_before_id: int | None


class Cancellation(str, enum.Enum):
    """What Queue.cancel_job did."""

    CANCELLED = "cancelled"  # it was queued or scheduled: it is in history as cancelled now
    REQUESTED = "requested"  # it is running: its worker was told, it ends as cancelled
    FINISHED = "finished"  # it had already finished: nothing was changed


class WorkflowJob(BaseModel):
    """One job of a workflow, as `Queue.get_workflow` shows it."""

    model_config = ConfigDict(frozen=True)

    id: int
    task: str
    queue: str
    status: JobStatus
    attempt: int
    finished_at: datetime | None
    waits_for: list[int] = Field(description="the jobs it waits for (while it is blocked)")
    pending: list[int] = Field(description="those of them that have not finished yet")
    progress: dict[str, Any] | None = None


class Workflow(BaseModel):
    """A workflow's jobs and where it stands (`Queue.get_workflow`). Its id is its first job's
    id; `Queue.enqueue_workflow` returns it with the ids of its jobs in the order built."""

    model_config = ConfigDict(frozen=True)

    id: int
    jobs: list[WorkflowJob]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """How many of its jobs are in each status."""
        out: dict[str, int] = {}
        for job in self.jobs:
            out[job.status.value] = out.get(job.status.value, 0) + 1
        return out

    @computed_field  # type: ignore[prop-decorator]
    @property
    def finished(self) -> bool:
        """Every job has succeeded, failed or been cancelled."""
        return all(job.status in FINAL_STATUSES for job in self.jobs)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def succeeded(self) -> bool:
        return all(job.status is JobStatus.SUCCEEDED for job in self.jobs)


class EnqueuedWorkflow(BaseModel):
    """What `enqueue_workflow` stored: the workflow's id and its jobs' ids, in the order the
    workflow was built (a chain's steps in order; a chord's members, then its callback)."""

    model_config = ConfigDict(frozen=True)

    id: int
    job_ids: list[int]


class RateLimit(BaseModel):
    """A rate limit, as `Queue.rate_limits()` lists it: of a queue, of a task, or of a
    concurrency key (key '*': the default of keys without their own). The other two are
    None."""

    model_config = ConfigDict(frozen=True)

    queue: str | None = None
    task: str | None = None
    key: str | None = None
    max_starts: int = Field(description="jobs that may start in any window of `period`")
    period: float = Field(description="the window, in seconds")
    recent_starts: int = Field(description="jobs started in the window that ends now")
    room_in: float = Field(description="seconds until another job may start (0: now)")


class QueuePause(BaseModel):
    """A paused queue, as `Queue.paused_queues()` lists it."""

    model_config = ConfigDict(frozen=True)

    queue: str
    paused_at: datetime
    reason: str


DESTINATION = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*:.+$")


class Message(BaseModel):
    """A message for another system, staged with `Queue.stage_many` and published by
    `pgqueue relay`. `destination` is "sink:target": the relay's sink by that name and
    where in it (an exchange and routing key, a stream, a subject, a Celery task). Messages
    with the same `key` are published in the order their transactions committed.
    `message_id` travels in the broker's own id field, so consumers can drop a duplicate;
    without one, the message's outbox id does."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    destination: str = Field(pattern=DESTINATION.pattern, max_length=500)
    message: Any
    key: str | None = Field(default=None, min_length=1, max_length=500)
    headers: dict[str, str] | None = None
    message_id: str | None = Field(default=None, min_length=1, max_length=500)


class OutboxStats(BaseModel):
    """The outbox as `pgqueue status` shows it."""

    model_config = ConfigDict(frozen=True)

    staged: int
    oldest_staged_at: datetime | None
    dead: int


class RelayState(BaseModel):
    """What a `pgqueue relay` process says of itself: whether it publishes or stands by, and
    what it has done since it started (`per_second`: published lately)."""

    model_config = ConfigDict(frozen=True)

    name: str
    hostname: str
    pid: int
    leading: bool
    started_at: datetime
    heartbeat_at: datetime | None = None
    published: int = 0
    refused: int = 0
    failed: int = 0
    per_second: float = 0.0
    last_error: str | None = None


class DeadMessage(BaseModel):
    """A message a broker refused for good, kept with the reason until retried."""

    model_config = ConfigDict(frozen=True)

    id: int
    destination: str
    key: str | None
    message_id: str | None
    attempts: int
    error: str | None
    dead_at: datetime | None


class JobFilter(Settings):
    """Filters of list_jobs; None means any. `concurrency_key` is the tenant (or other key) a
    job was enqueued with; `tag` one of its tags; `workflow` a workflow's id."""

    queue: str | None = None
    task: str | None = None
    concurrency_key: str | None = None
    tag: str | None = None
    workflow: int | None = None
    status: tuple[JobStatus, ...] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    before_id: int | None = Field(default=None, ge=1)
    after_id: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=1000)

    @field_validator("status", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, (str, JobStatus)) else value

    @field_validator("created_after", "created_before")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("times must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return value

    def params(self) -> dict[str, Any]:
        statuses = None if self.status is None else [s.value for s in self.status]
        return self.model_dump(exclude={"status"}) | {"statuses": statuses}


@dataclass(frozen=True, slots=True)
class NewJob(Generic[T_co]):
    """A validated job, ready to insert: its args are a JSON-ready object. For a type
    checker it is `NewJob[T]`, T what its task's handler returns (see Enqueued)."""

    task: str
    args: dict[str, Any]
    options: JobOptions
    atomic: bool = False

    def as_row(self) -> dict[str, Any]:
        opts = self.options
        return {
            "atomic": self.atomic,
            "queue": opts.queue,
            "task": self.task,
            "args": self.args,
            "priority": opts.priority,
            "max_attempts": opts.max_attempts,
            "run_at": opts.run_at.isoformat() if opts.run_at else None,
            "delay": opts.delay.total_seconds() if opts.delay else None,
            "dedupe_key": opts.dedupe_key,
            "dedupe_window": opts.dedupe_window.total_seconds() if opts.dedupe_window else None,
            "concurrency_key": opts.concurrency_key,
            "limit_keys": limit_keys(opts),
            "fairness_key": opts.fairness_key,
            "tags": list(opts.tags) if opts.tags else None,
        }


@dataclass(frozen=True, slots=True)
class TaskDeclaration:
    """What a task declares, as the tasks table keeps it for enqueue() in SQL to read."""

    name: str
    options: JobOptions
    policy: TaskPolicy
    atomic: bool = False

    def as_row(self) -> dict[str, Any]:
        """The row task_sync writes: durations in seconds, limit templates as declared."""
        opts, policy = self.options, self.policy
        return {
            "name": self.name,
            "queue": opts.queue,
            "priority": opts.priority,
            "max_attempts": opts.max_attempts,
            "delay": _seconds(opts.delay),
            "dedupe_window": _seconds(opts.dedupe_window),
            "atomic": self.atomic,
            "concurrency_key": opts.concurrency_key,
            "limit_keys": list(opts.limits) if opts.limits else None,
            "fairness_key": opts.fairness_key,
            "tags": list(opts.tags) if opts.tags else None,
            "retry_base": policy.retry.base.total_seconds(),
            "retry_cap": policy.retry.cap.total_seconds(),
            "retry_jitter": policy.retry.jitter,
            "timeout": _seconds(policy.timeout),
            "on_lost": policy.on_lost,
            "compensate_with": policy.compensate_with,
        }


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def limit_keys(options: JobOptions) -> list[str] | None:
    """The job's limit keys beyond its concurrency_key, sorted, as the jobs table stores them
    (limit_keys); None when there are none."""
    if options.limits is None:
        return None
    keys = sorted(set(options.limits) - {options.concurrency_key})
    return keys or None
