"""The queue of a schema laid out for Citus: enqueue onto shards, and refuse the rest.

Owns: each job's shard value (`shard_of`) and its insert on that shard, in the caller's
transaction. A job whose shard value equals the distribution value of the caller's other
rows in the transaction commits on their node alone; one on another node makes the
transaction commit by two-phase commit, which needs no more of pgqueue since the enqueue
sends no NOTIFY (the workers poll). A dedupe key holds within one shard value: the same key
on two shard values is two jobs. Every statement of an enqueue names its shard value, so
each runs on one node. `list_jobs` reads every shard through the coordinator. What Citus
cannot run raises CitusUnsupportedError before any SQL is sent: the methods listed in
REFUSED, and jobs that are atomic or carry limits or a fairness key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg

from pgqueue import dsn as dsn_rule
from pgqueue import hooks
from pgqueue.codec import encode_args, too_large
from pgqueue.errors import CitusUnsupportedError, ConfigurationError, InvalidArgumentsError
from pgqueue.models import Enqueued, Job, JobPage, NewJob
from pgqueue.queue.arguments import _jobs_only, _queue_names
from pgqueue.queue.connections import _connect
from pgqueue.queue.sync import Queue
from pgqueue.store import citus as store
from pgqueue.store.plan import Plan
from pgqueue.tenants import template_fields

if TYPE_CHECKING:
    from pgqueue.queue.plans import _JobFilters

DOCS = 'see "Running on Citus" in the docs'

# Queue methods whose statements cannot run on a distributed jobs table, and why.
_OUTBOX = "the relay's outbox is not laid out for Citus"
_RATES = "rate limits are not enforced on Citus"
_WORKFLOWS = "workflows are not laid out for Citus"
_WAITS = "waiting for a result is told by NOTIFY from the node that ran it"
REFUSED: dict[Callable[..., Any], str] = {
    Queue.cancel_job: "cancelling tells the running worker by NOTIFY",
    Queue.retry_job: "it reads and links jobs across shards",
    Queue.job_steps: "durable steps are not kept on Citus",
    Queue.set_concurrency_limit: "concurrency limits are not enforced on Citus",
    Queue.concurrency_limits: "concurrency limits are not enforced on Citus",
    Queue.set_fairness_weight: "fair shares are not kept on Citus",
    Queue.fair_shares: "fair shares are not kept on Citus",
    Queue.set_rate_limit: _RATES,
    Queue.set_task_rate_limit: _RATES,
    Queue.set_key_rate_limit: _RATES,
    Queue.rate_limits: _RATES,
    Queue.stage: _OUTBOX,
    Queue.stage_many: _OUTBOX,
    Queue.outbox_stats: _OUTBOX,
    Queue.dead_messages: _OUTBOX,
    Queue.retry_messages: _OUTBOX,
    Queue.enqueue_workflow: _WORKFLOWS,
    Queue.get_workflow: _WORKFLOWS,
    Queue.wait_workflow: _WORKFLOWS,
    Queue.wait: _WAITS,
    Queue.wait_many: _WAITS,
    Queue.as_completed: _WAITS,
    Queue.signal: "signals are not laid out for Citus",
    Queue.periodic: "the recurring scheduler does not run on Citus",
}


def shard_of(job: NewJob) -> str:
    """A job's shard value: its `shard_key` (a template such as "{tenant_id}" is filled from
    the job's arguments), else its concurrency key, else its queue's name."""
    options = job.options
    key = options.shard_key
    if key is None:
        return options.concurrency_key or options.queue
    if not template_fields(key):
        return key
    try:
        value = key.format_map(job.args)
    except (KeyError, IndexError, AttributeError, ValueError) as exc:
        raise InvalidArgumentsError(
            f"task {job.task!r}: shard_key {key!r} cannot be filled from its arguments "
            f"({exc!r}): pass the argument it names, or a shard_key"
        ) from None
    if not 1 <= len(value) <= 255 or "\x00" in value:
        raise InvalidArgumentsError(
            f"task {job.task!r}: shard_key {key!r} gives {value!r}, not 1-255 characters "
            "without NUL"
        )
    return value


class CitusQueue(Queue):
    """A Queue on a schema laid out with `pgqueue migrate --citus` (or `migrate()` here), used
    through the coordinator's DSN. Enqueue as with a Queue, in your own transaction (`conn=`)
    or not; each job goes to the shard `shard_of` names."""

    def enqueue_many(self, jobs: Iterable[NewJob], *, conn: Any = None) -> list[Enqueued]:
        """Store jobs, each on its shard, in one transaction; ids in the order given. A dedupe
        key holds per shard value: a job whose shard already has a live job with its key, or
        one finished within its `dedupe_window`, is not stored, and its id is that job's, with
        `created` False. The same key on another shard value is another job."""
        batch = _jobs_only(jobs)
        if not batch:
            return []
        hooked = hooks.enqueuing(batch, self.enqueue_hooks)
        if hooked is None:
            return self._store_rows(batch, conn, None)
        with hooked as call:
            call.ids.extend(ids := self._store_rows(batch, conn, call.trace_context))
            return ids

    def _store_rows(self, batch: Sequence[NewJob], conn: Any, traced: str | None) -> list[Enqueued]:
        rows = [self._row(index, job, traced) for index, job in enumerate(batch)]
        with self._connection(conn) as c:
            return store.enqueue(c, self.schema, rows)

    def migrate(self, *, conn: psycopg.Connection[Any] | None = None) -> list[str]:
        """Apply pending migrations and lay the schema out for the cluster (`pgqueue migrate
        --citus`); the migrations' names. `conn`: autocommit, on the coordinator."""
        from pgqueue.citus.layout import migrate

        if conn is not None:
            return [f"{m.version:04d}_{m.name}" for m in migrate(conn, self.schema)]
        if self.dsn is None:
            raise ConfigurationError(dsn_rule.missing("CitusQueue"))
        with _connect(self.dsn, autocommit=True) as own:
            return self.migrate(conn=own)

    def _list_plan(self, filters: _JobFilters) -> Plan[JobPage]:
        # The coordinator reads the hot table and history one after the other, each shard
        # with its own snapshot: a job that finishes between the two reads comes back from
        # both, and is listed once, as finished (tests/citus/test_list_jobs.py).
        page = yield from super()._list_plan(filters)
        return JobPage(jobs=_once_each(page.jobs), next_before_id=page.next_before_id)

    def _pause_plan(self, queues: str | Sequence[str], reason: str) -> Plan[list[str]]:
        if not isinstance(reason, str) or len(reason) > 1000 or "\x00" in reason:
            raise ConfigurationError("a pause's reason is a string of at most 1000 characters")
        return store.pause_plan(self.schema, _queue_names(queues), reason)

    def _resume_plan(self, queues: str | Sequence[str]) -> Plan[list[str]]:
        return store.resume_plan(self.schema, _queue_names(queues))

    def _row(self, index: int, job: NewJob, traced: str | None) -> dict[str, Any]:
        options = job.options
        for given, what in (
            (job.atomic, "atomic tasks"),
            (options.limits, "limits"),
            (options.fairness_key, "fairness keys"),
        ):
            if given:
                raise CitusUnsupportedError(
                    f"task {job.task!r}: {what} are not available on Citus ({DOCS})"
                )
        args = encode_args(job)
        limit = self.settings.max_payload_bytes
        if len(args) > limit:
            raise too_large(index, job, len(args), limit)
        return {
            "shard": shard_of(job),
            "queue": options.queue,
            "task": job.task,
            "args": args,
            "priority": options.priority,
            "max_attempts": options.max_attempts,
            "run_at": options.run_at,
            "delay": options.delay.total_seconds() if options.delay else None,
            "concurrency_key": options.concurrency_key,
            "tags": list(options.tags) if options.tags else None,
            "trace_context": traced,
            "dedupe_key": options.dedupe_key,
            "dedupe_window": window.total_seconds() if (window := options.dedupe_window) else None,
        }


def _once_each(jobs: list[Job]) -> list[Job]:
    """`jobs` with each id once: its finished record where there are two."""
    by_id: dict[int, Job] = {}
    for job in jobs:
        if job.id not in by_id or job.finished_at is not None:
            by_id[job.id] = job
    return list(by_id.values())


def _refusal(name: str, why: str) -> Any:
    def refused(self: CitusQueue, *args: Any, **kwargs: Any) -> NoReturn:
        raise CitusUnsupportedError(f"Queue.{name} is not available on Citus: {why} ({DOCS})")

    refused.__name__ = name
    refused.__doc__ = f"Refused on Citus: {why}."
    return refused


for _method, _why in REFUSED.items():
    setattr(CitusQueue, _method.__name__, _refusal(_method.__name__, _why))
