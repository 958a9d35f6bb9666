"""The workflow page: a workflow's jobs, their states and results, and what waits for what.

Owns: reading one page of a workflow through the store (its counts by status, up to
MEMBERS_PER_PAGE jobs after a given id, and the edges that touch them), and cutting what
the page shows to a bounded size. Nothing here writes.

Invariants: every read is bounded however large the workflow (keyset pages by job id;
results and errors cut in the database; at most EDGES_PER_JOB edges each way per job). The
database keeps an edge only while the job that waits is blocked: once released or cancelled,
its edges are gone, so a finished workflow shows its members and no edges, and the page says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgqueue.dashboard.pages import FilterError
from pgqueue.store.plan import SyncConn, run
from pgqueue.store.workflows import (
    WorkflowEdge,
    WorkflowMember,
    counts_plan,
    edges_plan,
    members_plan,
)

MEMBERS_PER_PAGE = 100
RESULT_CHARS = 300  # of a result's or an error's text, in the table
EDGES_PER_JOB = 20  # each way: a chord's callback may wait for thousands
LARGEST_ID = 2**63 - 1  # job ids are bigint


@dataclass(frozen=True)
class Member:
    """A job of the page, with the edges that touch it, each list cut at EDGES_PER_JOB
    (`more_waits_for`, `more_waited_on_by`: some were left out)."""

    job: WorkflowMember
    waits_for: list[WorkflowEdge]
    more_waits_for: bool
    waited_on_by: list[WorkflowEdge]
    more_waited_on_by: bool

    @property
    def result(self) -> str | None:
        """The result's JSON text as shown: cut, and saying its whole length, when long."""
        text, chars = self.job.result_text, self.job.result_chars
        if text is None or chars is None:
            return None
        return text if chars <= RESULT_CHARS else f"{text}… ({chars:,} characters)"

    @property
    def error(self) -> str | None:
        error = self.job.last_error
        if error is None or len(error) < RESULT_CHARS:
            return error
        return error + "…"


@dataclass(frozen=True)
class WorkflowPage:
    id: int
    counts: dict[str, int]
    members: list[Member]
    after: int  # the page lists jobs with ids above this
    next_after: int | None  # where the next page starts; None: this is the last

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def parse_after(text: str) -> int:
    """The page's `after` parameter: empty for the first page, else a job id."""
    text = text.strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) > LARGEST_ID:
        raise FilterError(f"after {text[:50]!r} is not a job id: give the id the page starts after")
    return int(text)


def read(conn: SyncConn, schema: str, workflow_id: int, after_text: str) -> WorkflowPage | None:
    """The page of workflow `workflow_id` after the job id `after_text`; None if no job,
    live or in history, belongs to the workflow."""
    after = parse_after(after_text)
    if workflow_id > LARGEST_ID:
        return None
    counts = run(conn, counts_plan(workflow_id, schema), together=False)
    if not counts:
        return None
    found = run(
        conn,
        members_plan(
            workflow_id, schema, after=after, limit=MEMBERS_PER_PAGE + 1, chars=RESULT_CHARS
        ),
        together=False,
    )
    jobs = found[:MEMBERS_PER_PAGE]
    edges = run(
        conn, edges_plan([j.id for j in jobs], schema, per_job=EDGES_PER_JOB + 1), together=False
    )
    return WorkflowPage(
        id=workflow_id,
        counts=counts,
        members=[_member(job, edges) for job in jobs],
        after=after,
        next_after=jobs[-1].id if len(found) > MEMBERS_PER_PAGE else None,
    )


def _member(job: WorkflowMember, edges: list[WorkflowEdge]) -> Member:
    waits = sorted((e for e in edges if e.job_id == job.id), key=lambda e: e.depends_on)
    waited = sorted((e for e in edges if e.depends_on == job.id), key=lambda e: e.job_id)
    return Member(
        job=job,
        waits_for=waits[:EDGES_PER_JOB],
        more_waits_for=len(waits) > EDGES_PER_JOB,
        waited_on_by=waited[:EDGES_PER_JOB],
        more_waited_on_by=len(waited) > EDGES_PER_JOB,
    )
