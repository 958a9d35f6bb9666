"""Workflows and progress: runs sql/queries/workflows.sql.

A workflow is stored by one plan in the caller's transaction: ids reserved, the jobs it
waits for that were enqueued before it marked and locked (workflow_mark), then its jobs,
edges and counts in one statement (workflow_insert). The dashboard reads a workflow a page
at a time (members_plan, counts_plan, edges_plan): every read is bounded however large it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgqueue.codec import encode_args, encode_json, encode_rows, too_large
from pgqueue.errors import JobNotFoundError, JobStateError
from pgqueue.models import EnqueuedWorkflow, JobStatus, Workflow, WorkflowJob
from pgqueue.queries import query
from pgqueue.store import fairness
from pgqueue.store.jobs import reserve_ids_plan
from pgqueue.store.plan import AsyncConn, Plan, execute, rows_as
from pgqueue.tenants import check_keyed_atomic
from pgqueue.workflow import Node


@dataclass(frozen=True)
class Marked:
    """A row of workflow_mark: a job the workflow's jobs wait for, whether it is still live
    (and now marked as waited for), else how it finished and its result (status None: no
    such job)."""

    id: int
    live: bool
    status: str | None
    result: object


def enqueue_plan(
    nodes: Sequence[Node], schema: str, max_payload_bytes: int | None
) -> Plan[EnqueuedWorkflow]:
    """Store a built workflow (pgqueue/workflow.py); its id is its first job's."""
    for index, node in enumerate(nodes):
        job = node.job
        if job.atomic:
            check_keyed_atomic(job.task, job.options)
        if max_payload_bytes is not None:
            size = len(encode_args(job))
            if size > max_payload_bytes:
                raise too_large(index, job, size, max_payload_bytes)
    ids = yield from reserve_ids_plan(len(nodes), schema)
    vtimes = yield from fairness.stamp_plan([node.job for node in nodes], schema)
    workflow = ids[0]
    earlier = sorted({i for node in nodes for i in node.after_ids})
    done: dict[int, tuple[str, Any]] = {}
    if earlier:
        rows = yield query("workflow_mark", schema), {"workflow": workflow, "ids": earlier}
        for row in rows_as(Marked, rows):
            if row.live:
                continue
            if row.status is None:
                raise JobNotFoundError(f"no job has id {row.id}, live or in history")
            done[row.id] = (row.status, row.result)
    jobs: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for index, node in enumerate(nodes):
        job_id = ids[index]
        deps = [ids[a] for a in node.after] + node.after_ids
        failed = [d for d in deps if d in done and done[d][0] != "succeeded"]
        if failed and node.on_failure == "cancel":
            raise JobStateError(
                f"job {failed[0]} already {done[failed[0]][0]}: a job that runs only after it "
                "succeeds would never run (on_failure='run' runs it anyway)"
            )
        remaining = sum(1 for d in deps if d not in done)
        args = node.job.args
        if deps and not remaining and node.result_arg is not None:
            results = [done[d][1] if done[d][0] == "succeeded" else None for d in deps]
            args = args | {node.result_arg: results if node.result_list else results[0]}
        if remaining:
            for position, dep in enumerate(deps):
                status, result = done.get(dep, (None, None))
                edges.append(
                    {
                        "depends_on": dep,
                        "job_id": job_id,
                        "position": position,
                        "status": status,
                        "result": result if status == "succeeded" else None,
                    }
                )
        jobs.append(
            node.job.as_row()
            | {
                "id": job_id,
                "args": args,
                "vtime": vtimes[index],
                "remaining": remaining,
                "on_failure": node.on_failure,
                "result_arg": node.result_arg,
                "result_list": node.result_list,
            }
        )
    params = {"jobs": encode_rows(jobs), "edges": encode_json(edges), "workflow": workflow}
    yield (
        query("workflow_insert", schema),
        params | {"now": None, "trace_context": None},  # no enqueue hook runs around a workflow
    )
    return EnqueuedWorkflow(id=workflow, job_ids=ids)


def get_plan(workflow: int, schema: str) -> Plan[Workflow | None]:
    """A workflow's jobs, live and finished; None if it has none."""
    rows = yield query("workflow_jobs", schema), {"workflow": workflow}
    if not rows:
        return None
    jobs = [
        WorkflowJob.model_validate(row, from_attributes=True)
        for row in rows_as(WorkflowJobRow, rows)
    ]
    return Workflow(id=workflow, jobs=jobs)


@dataclass(frozen=True)
class WorkflowJobRow:
    """A row of workflow_jobs."""

    id: int
    task: str
    queue: str
    status: str
    attempt: int
    finished_at: datetime | None
    waits_for: list[int]
    pending: list[int]
    progress: dict[str, object] | None


@dataclass(frozen=True)
class StatusCount:
    """A row of workflow_read_counts."""

    status: str
    jobs: int


@dataclass(frozen=True)
class WorkflowMember:
    """One job of a workflow as its page lists it. `result_text` is the stored result's JSON
    text, cut at the length asked for; `result_chars` is its whole length (both None while
    the job is live, or when it stored no result)."""

    id: int
    task: str
    queue: str
    status: JobStatus
    attempt: int
    max_attempts: int
    created_at: datetime
    finished_at: datetime | None
    result_text: str | None
    result_chars: int | None
    last_error: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))  # the row's text


@dataclass(frozen=True)
class WorkflowEdge:
    """Job `job_id` waits for job `depends_on`; `status` is how that one finished (None: not
    yet)."""

    job_id: int
    depends_on: int
    status: str | None


def members_plan(
    workflow: int, schema: str, *, after: int, limit: int, chars: int
) -> Plan[list[WorkflowMember]]:
    """At most `limit` of the workflow's jobs with ids above `after`, in id order."""
    params = {"workflow": workflow, "after": after, "limit": limit, "chars": chars}
    rows = yield query("workflow_read_members", schema), params
    return rows_as(WorkflowMember, rows)


def counts_plan(workflow: int, schema: str) -> Plan[dict[str, int]]:
    """How many of the workflow's jobs are in each status; empty if it has none."""
    rows = yield query("workflow_read_counts", schema), {"workflow": workflow}
    return {row.status: row.jobs for row in rows_as(StatusCount, rows)}


def edges_plan(ids: Sequence[int], schema: str, *, per_job: int) -> Plan[list[WorkflowEdge]]:
    """The edges that touch jobs `ids`, at most `per_job` each way per job."""
    rows = yield query("workflow_read_edges", schema), {"ids": list(ids), "per_job": per_job}
    return rows_as(WorkflowEdge, rows)


async def write_progress(conn: AsyncConn, schema: str, rows: Sequence[dict[str, object]]) -> None:
    """Write running jobs' latest progress reports in one statement."""
    await execute(conn, query("job_progress", schema), {"rows": encode_json(list(rows))})
