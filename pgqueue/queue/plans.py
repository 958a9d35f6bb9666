"""The statements and plans of each call of the client, the same for both twins; each twin
runs them on its connection (pgqueue/store/plan.py: `run`, `run_async`).

Owns: the arguments no model checks, checked before any statement is built (ids, queue
names, rates, a signal's key and payload), and the store's plan for each call. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pgqueue.codec import step_json
from pgqueue.errors import ConfigurationError, InvalidArgumentsError
from pgqueue.models import (
    Cancellation,
    DeadMessage,
    Enqueued,
    EnqueuedWorkflow,
    Job,
    JobFilter,
    JobPage,
    JobSteps,
    Message,
    NewJob,
    QueuePause,
    QueueSettings,
    RateLimit,
    Workflow,
    duration,
)
from pgqueue.queue.arguments import _message_id, _queue_names, _rate
from pgqueue.queue.outcomes import checked_job_id
from pgqueue.registry import Registry
from pgqueue.steps import KEY_MAX, check_label
from pgqueue.store import concurrency
from pgqueue.store import fairness as fairness_store
from pgqueue.store import jobs as jobs_store
from pgqueue.store import outbox as outbox_store
from pgqueue.store import queues as queues_store
from pgqueue.store import signals as signals_store
from pgqueue.store import steps as steps_store
from pgqueue.store import tasks as tasks_store
from pgqueue.store import workflows as workflows_store
from pgqueue.store.plan import Plan, Step
from pgqueue.tenants import ConcurrencyLimit, FairShare
from pgqueue.workflow import Flow, OnFailure, build

if TYPE_CHECKING:
    from datetime import datetime

    from typing_extensions import TypedDict

    from pgqueue.models import JobStatus, StatusName

    class _JobFilters(TypedDict, total=False):
        """The filters of `list_jobs(...)`; see the method."""

        queue: str | None
        task: str | None
        concurrency_key: str | None
        tag: str | None
        workflow: int | None
        status: StatusName | JobStatus | Sequence[StatusName | JobStatus] | None
        created_after: datetime | None
        created_before: datetime | None
        before_id: int | None
        after_id: int | None
        limit: int


class Plans:
    """The plan of each call, from the queue's settings and registry."""

    settings: QueueSettings
    registry: Registry

    @property
    def schema(self) -> str:
        """The PostgreSQL schema that holds this queue's tables and functions."""
        return self.settings.schema_name

    # `traced` is the trace context the enqueue hooks gave the jobs' rows (hooks.Enqueuing).

    def _insert(self, batch: Sequence[NewJob], alone: bool, traced: str | None) -> Step:
        limit = self.settings.max_payload_bytes
        return jobs_store.insert(batch, self.schema, limit, alone=alone, trace_context=traced)

    def _enqueue_plan(self, batch: Sequence[NewJob], traced: str | None) -> Plan[list[Enqueued]]:
        limit = self.settings.max_payload_bytes
        return jobs_store.enqueue_plan(batch, self.schema, limit, traced)

    def _get_plan(self, job_id: int) -> Plan[Job | None]:
        return jobs_store.get_plan(checked_job_id(job_id), self.schema)

    def _steps_plan(self, job_id: int) -> Plan[JobSteps]:
        return steps_store.steps_plan(self.schema, checked_job_id(job_id))

    def _sync_plan(self) -> Plan[list[str]]:
        return tasks_store.sync_plan(self.schema, self.registry.declarations())

    def _list_plan(self, filters: _JobFilters) -> Plan[JobPage]:
        given: dict[str, Any] = dict(filters)
        return jobs_store.list_plan(JobFilter(**given), self.schema)

    def _cancel_plan(self, job_id: int) -> Plan[Cancellation]:
        return jobs_store.cancel_plan(
            checked_job_id(job_id), self.schema, self.settings.keep_history
        )

    def _retry_plan(self, job_id: int) -> Plan[Enqueued]:
        return jobs_store.retry_plan(
            checked_job_id(job_id), self.schema, self.settings.max_payload_bytes
        )

    def _set_limit_plan(self, key: str | None, max_running: int | None) -> Plan[None]:
        return concurrency.set_limit_plan(self.schema, key, max_running)

    def _limits_plan(self) -> Plan[list[ConcurrencyLimit]]:
        return concurrency.list_limits_plan(self.schema)

    def _weight_plan(self, key: str, weight: float | None) -> Plan[None]:
        return fairness_store.set_weight_plan(self.schema, key, weight)

    def _shares_plan(self, window: timedelta | float) -> Plan[list[FairShare]]:
        seconds = duration(window, "window")
        if seconds is None or seconds <= timedelta(0):
            raise ConfigurationError(f"window={window!r}: give a positive duration")
        return fairness_store.shares_plan(self.schema, seconds.total_seconds())

    def _pause_plan(self, queues: str | Sequence[str], reason: str) -> Plan[list[str]]:
        if not isinstance(reason, str) or len(reason) > 1000 or "\x00" in reason:
            raise ConfigurationError("a pause's reason is a string of at most 1000 characters")
        return queues_store.pause_plan(self.schema, _queue_names(queues), reason)

    def _stage_plan(self, messages: Iterable[Message]) -> Plan[list[int]]:
        batch = list(messages)
        return outbox_store.insert_plan(self.schema, batch, self.settings.max_payload_bytes)

    def _dead_plan(self, limit: int) -> Plan[list[DeadMessage]]:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit is a whole number from 1 to 1000, got {limit!r}")
        return outbox_store.dead_plan(self.schema, limit)

    def _retry_messages_plan(self, ids: Sequence[int] | None) -> Plan[int]:
        checked = None if ids is None else [_message_id(i) for i in ids]
        return outbox_store.retry_plan(self.schema, checked)

    def _resume_plan(self, queues: str | Sequence[str]) -> Plan[list[str]]:
        return queues_store.resume_plan(self.schema, _queue_names(queues))

    def _paused_plan(self) -> Plan[list[QueuePause]]:
        return queues_store.paused_plan(self.schema)

    def _set_rate_plan(
        self, queue: str, limit: int | str | None, per: timedelta | float | None
    ) -> Plan[Any]:
        if not isinstance(queue, str):
            raise ConfigurationError(f"set_rate_limit takes one queue name, got {queue!r}")
        name = _queue_names(queue)[0]
        if limit is None:
            if per is not None:
                raise ConfigurationError("per= goes with a limit; pass None alone to remove it")
            return queues_store.remove_rate_plan(self.schema, name)
        max_starts, period = _rate(limit, per)
        return queues_store.set_rate_plan(self.schema, name, max_starts, period)

    def _set_job_rate_plan(
        self,
        kind: Literal["task", "key"],
        name: str,
        limit: int | str | None,
        per: timedelta | float | None,
    ) -> Plan[Any]:
        if limit is None:
            if per is not None:
                raise ConfigurationError("per= goes with a limit; pass None alone to remove it")
            return queues_store.remove_job_rate_plan(self.schema, kind, name)
        max_starts, period = _rate(limit, per)
        return queues_store.set_job_rate_plan(self.schema, kind, name, max_starts, period)

    def _rates_plan(self) -> Plan[list[RateLimit]]:
        queues = yield from queues_store.rates_plan(self.schema)
        jobs = yield from queues_store.job_rates_plan(self.schema)
        return queues + jobs

    def _workflow_plan(
        self, flow: Flow, after: Iterable[int], on_failure: OnFailure
    ) -> Plan[EnqueuedWorkflow]:
        nodes = build(flow, [checked_job_id(i) for i in after], on_failure)
        return workflows_store.enqueue_plan(nodes, self.schema, self.settings.max_payload_bytes)

    def _get_workflow_plan(self, workflow_id: int) -> Plan[Workflow | None]:
        return workflows_store.get_plan(checked_job_id(workflow_id), self.schema)

    def _signal_plan(self, key: str, payload: Any) -> Plan[int]:
        """signal's plan: the key and payload checked, then the signal stored and its oldest
        waiter woken; the signal's id. InvalidArgumentsError for a payload that is not JSON,
        ConfigurationError for a bad key."""
        key = check_label("signal key", key, KEY_MAX)
        try:
            encoded = step_json(payload, self.settings.max_payload_bytes)
        except ValueError as exc:
            raise InvalidArgumentsError(
                f"signal {key!r}: its payload cannot be stored: {exc}"
            ) from None
        return signals_store.send_plan(self.schema, key, encoded)
