"""Workflows: chain, group and chord, built on jobs that wait for other jobs.

Owns: turning a workflow into the rows one enqueue stores, in the caller's transaction: its
jobs in order, what each waits for, and where each receives results. Nothing here touches the
database; store/workflows.py stores what `build` makes, and the database settles each job's
dependants as it finishes (sql/migrations/0010_workflows.sql).

Invariants:
- A step waits for every job that ends the step before it: a chain's last step, each member
  of a group, a chord's callback.
- A step made with `task.s(...)` that waits for something receives its results in its first
  parameter left out: one result after a single job, the list of results (in member order)
  after a group, a chord's header, or jobs given by id. A step made with `task.job(...)`
  receives nothing.
- A dependency that fails or is cancelled cancels what waits for it, transitively, unless
  that job runs on failure too (`chord(..., on_failure="run")`): it then receives None for
  each result it lacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal, Union

from pgqueue.errors import ConfigurationError
from pgqueue.models import NewJob
from pgqueue.registry import Signature

OnFailure = Literal["cancel", "run"]
MAX_JOBS = 100_000  # jobs in one workflow: one statement inserts them all


@dataclass(frozen=True)
class Chain:
    """Steps that run one after the other; each starts once the one before succeeded."""

    steps: tuple[Flow, ...]


@dataclass(frozen=True)
class Group:
    """Members that run in parallel."""

    members: tuple[Flow, ...]


@dataclass(frozen=True)
class Chord:
    """A group and a callback that runs once after every member has finished."""

    header: Group
    callback: NewJob | Signature
    on_failure: OnFailure = "cancel"


Flow = Union[NewJob, Signature, Chain, Group, Chord]  # noqa: UP007 (an alias, evaluated)


def chain(*steps: Flow) -> Chain:
    """`chain(a.job(x), b.s(), c.s())`: b gets a's result, c gets b's. A step that fails (once
    its retries are spent) or is cancelled cancels the steps after it."""
    if not steps:
        raise ConfigurationError("chain() needs at least one step")
    return Chain(tuple(_flow(step, "chain") for step in steps))


def group(*members: Flow | Iterable[Flow]) -> Group:
    """`group(a.job(1), a.job(2))`, or `group(a.job(i) for i in range(10))`: run in parallel."""
    flat: list[Flow] = []
    for member in members:
        if isinstance(member, (NewJob, Signature, Chain, Group, Chord)):
            flat.append(member)
        elif isinstance(member, Iterable) and not isinstance(member, (str, bytes, dict)):
            flat.extend(_flow(m, "group") for m in member)
        else:
            _flow(member, "group")
    if not flat:
        raise ConfigurationError("group() needs at least one member")
    return Group(tuple(flat))


def chord(
    header: Group | Iterable[Flow],
    callback: NewJob | Signature,
    *,
    on_failure: OnFailure = "cancel",
) -> Chord:
    """`chord(group(...), summarize.s())`: the callback runs once, after every member has
    finished, and receives their results as a list in member order. `on_failure="cancel"`
    (the default) cancels it if a member fails or is cancelled; `"run"` runs it anyway, with
    None for each result it lacks."""
    if on_failure not in ("cancel", "run"):
        raise ConfigurationError(f"on_failure is 'cancel' or 'run', got {on_failure!r}")
    members = header if isinstance(header, Group) else group(header)
    if not isinstance(callback, (NewJob, Signature)):
        raise ConfigurationError(
            f"a chord's callback is task.s(...) or task.job(...), got {type(callback).__name__}"
        )
    return Chord(members, callback, on_failure)


def _flow(value: object, where: str) -> Flow:
    if isinstance(value, (NewJob, Signature, Chain, Group, Chord)):
        return value
    raise ConfigurationError(
        f"{where}() takes task.job(...), task.s(...), chain, group or chord, got "
        f"{type(value).__name__}"
    )


@dataclass
class Node:
    """One job of a built workflow: what it waits for (indexes of earlier nodes, and ids of
    jobs enqueued before), and how it takes their results."""

    job: NewJob
    after: list[int] = field(default_factory=list)
    after_ids: list[int] = field(default_factory=list)
    result_arg: str | None = None
    result_list: bool = False
    on_failure: OnFailure = "cancel"


def build(flow: Flow, after: Iterable[int] = (), on_failure: OnFailure = "cancel") -> list[Node]:
    """The workflow's jobs in order; its first steps wait for the jobs `after` names."""
    if not isinstance(flow, (NewJob, Signature, Chain, Group, Chord)):
        _flow(flow, "enqueue_workflow")
    if on_failure not in ("cancel", "run"):
        raise ConfigurationError(f"on_failure is 'cancel' or 'run', got {on_failure!r}")
    builder = _Builder(list(after), on_failure)
    builder.add(flow, [], listed=True)  # jobs given by id: a list, however many
    if len(builder.nodes) > MAX_JOBS:
        raise ConfigurationError(
            f"a workflow holds at most {MAX_JOBS:,} jobs, this one {len(builder.nodes):,}"
        )
    return builder.nodes


class _Builder:
    def __init__(self, after_ids: list[int], on_failure: OnFailure) -> None:
        self.nodes: list[Node] = []
        self.after_ids = after_ids
        self.on_failure = on_failure

    def add(
        self, flow: Flow, after: list[int], *, listed: bool, on_failure: OnFailure | None = None
    ) -> tuple[list[int], bool]:
        """Add `flow` waiting for nodes `after` (or, at the start, for the given ids); its
        last jobs, and whether what waits for them receives a list."""
        if isinstance(flow, (NewJob, Signature)):
            return [self._job(flow, after, listed, on_failure)], False
        if isinstance(flow, Chain):
            tails = after
            for step in flow.steps:
                tails, listed = self.add(step, tails, listed=listed)
            return tails, listed
        if isinstance(flow, Group):
            ends: list[int] = []
            for member in flow.members:
                ends += self.add(member, after, listed=listed)[0]
            return ends, True
        tails, _ = self.add(flow.header, after, listed=listed)
        return self.add(flow.callback, tails, listed=True, on_failure=flow.on_failure)

    def _job(
        self,
        step: NewJob | Signature,
        after: list[int],
        listed: bool,
        on_failure: OnFailure | None,
    ) -> int:
        after_ids = [] if after else self.after_ids
        waits = bool(after or after_ids)
        if isinstance(step, Signature):
            job, param = step.job(receives=waits)
        else:
            job, param = step, None
        if job.options.dedupe_key is not None:
            raise ConfigurationError(
                f"task {job.task!r}: a workflow's jobs cannot carry a dedupe_key (a duplicate "
                "would leave what waits for it without its result)"
            )
        self.nodes.append(
            Node(
                job=job,
                after=list(after),
                after_ids=list(after_ids),
                result_arg=param,
                result_list=listed,
                on_failure=on_failure or self.on_failure,
            )
        )
        return len(self.nodes) - 1
