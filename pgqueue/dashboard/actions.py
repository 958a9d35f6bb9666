"""The dashboard's actions: retry and cancel a job, bulk retry or cancel of a filtered
selection, pause and resume a queue, set a tenant's limit.

Invariants: each action is a POST that passes the CSRF check and Access.may_act before it
touches the database, then calls pgqueue's public API on the actions pool, whose statements
guard each change (a job already retried or finished is refused there, and said so). A bulk
action changes at most BULK_MAX jobs per click. The redirect back stays inside the dashboard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from pgqueue.dashboard import pages
from pgqueue.dashboard.security import CSRF_FIELD, csrf_valid
from pgqueue.dashboard.views import Views, root
from pgqueue.errors import PgQueueError
from pgqueue.models import JobStatus
from pgqueue.queue import Queue

BULK_MAX = 1000  # jobs one bulk action changes; the operator repeats it for more
RETRYABLE = (JobStatus.FAILED, JobStatus.CANCELLED)
CANCELLABLE = (
    JobStatus.QUEUED,
    JobStatus.SCHEDULED,
    JobStatus.RUNNING,
    JobStatus.WAITING,
    JobStatus.BLOCKED,
)


class Actions(Views):
    async def guarded(self, request: Request, change: Callable[[Any], Awaitable[str]]) -> Response:
        """An action: allowed, with a valid CSRF token, then `change` (its note shown)."""
        form = await request.form()
        if not csrf_valid(request, form.get(CSRF_FIELD)):
            return self.render(
                request,
                "error.html",
                403,
                problem="the form expired or came from another site: reload and try again",
            )
        if not self.board.access.may_act(request):
            problem = (
                "actions are off: start the dashboard with --allow-actions and a token"
                if not self.board.access.allow_actions
                else "this action needs authentication"
            )
            return self.render(request, "error.html", 403, problem=problem)
        try:
            note = await change(form)
        except PgQueueError as exc:
            note = f"refused: {exc}"
            if isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege):
                note = (
                    f"refused by the database: {exc.__cause__.diag.message_primary}; the "
                    "dashboard's actions need a role granted `pgqueue grant ROLE --kind operator`"
                )
        back = str(form.get("back", ""))
        # Only a path inside the dashboard: never another site (//host, or a backslash
        # that some browsers read as a slash).
        if not back.startswith(root(request)) or back.startswith("//") or "\\" in back:
            back = str(request.url_for("queues"))
        separator = "&" if "?" in back else "?"
        return RedirectResponse(back + separator + urlencode({"note": note}), status_code=303)

    async def job_action(self, request: Request) -> Response:
        job_id, action = request.path_params["job_id"], request.path_params["action"]
        queue = self.board.queue

        async def change(form: Any) -> str:
            if action == "retry":
                new = await run_in_threadpool(
                    self.board.act, lambda c: queue.retry_job(job_id, conn=c)
                )
                return f"job {job_id} retried as job {int(new)}"
            if action == "cancel":
                done = await run_in_threadpool(
                    self.board.act, lambda c: queue.cancel_job(job_id, conn=c)
                )
                return f"job {job_id}: {done.value}"
            return f"unknown action {action!r}"

        return await self.guarded(request, change)

    async def queue_action(self, request: Request) -> Response:
        name, action = request.path_params["queue"], request.path_params["action"]
        queue = self.board.queue

        async def change(form: Any) -> str:
            if action == "pause":
                reason = str(form.get("reason", "paused from the dashboard"))[:1000]
                await run_in_threadpool(
                    self.board.act, lambda c: queue.pause_queue(name, reason=reason, conn=c)
                )
                return f"queue {name} paused: its workers claim none of its jobs"
            if action == "resume":
                await run_in_threadpool(self.board.act, lambda c: queue.resume_queue(name, conn=c))
                return f"queue {name} resumed"
            return f"unknown action {action!r}"

        return await self.guarded(request, change)

    async def set_tenant(self, request: Request) -> Response:
        queue = self.board.queue

        async def change(form: Any) -> str:
            key = str(form.get("key", "")).strip()
            limit_text = str(form.get("max_running", "")).strip()
            if not key:
                return "refused: give a tenant key (or * for the default)"
            if limit_text and not limit_text.isdigit():
                return f"refused: the limit {limit_text!r} is not a whole number"
            limit = int(limit_text) if limit_text else None
            target = None if key == "*" else key
            await run_in_threadpool(
                self.board.act, lambda c: queue.set_concurrency_limit(target, limit, conn=c)
            )
            return f"tenant {key}: " + (
                f"at most {limit} running" if limit is not None else "no limit"
            )

        return await self.guarded(request, change)

    async def bulk(self, request: Request) -> Response:
        queue = self.board.queue

        async def change(form: Any) -> str:
            action = str(form.get("action", ""))
            if action not in ("retry", "cancel"):
                return f"unknown action {action!r}"
            chosen = pages.JobFilterForm.read(form)
            filters = chosen.filters()
            allowed = RETRYABLE if action == "retry" else CANCELLABLE
            wanted = filters.get("status") or allowed
            filters["status"] = tuple(s for s in wanted if s in allowed)
            if not filters["status"]:
                return f"nothing to {action}: no job in those statuses can be {action}ed"
            return await run_in_threadpool(self.board.act, _bulk, queue, action, filters)

        return await self.guarded(request, change)


def _bulk(conn: Any, queue: Queue, action: str, filters: dict[str, Any]) -> str:
    """`action` on up to BULK_MAX jobs matching `filters`, page by page, newest first."""
    done = refused = 0
    seen = 0
    before: int | None = filters.pop("before_id", None)
    while seen < BULK_MAX:
        page = queue.list_jobs(
            conn=conn, limit=min(100, BULK_MAX - seen), before_id=before, **filters
        )
        for job in page.jobs:
            seen += 1
            try:
                if action == "retry":
                    queue.retry_job(job.id, conn=conn)
                else:
                    queue.cancel_job(job.id, conn=conn)
                done += 1
            except PgQueueError:
                refused += 1  # already retried, or finished meanwhile
        if page.next_before_id is None:
            break
        before = page.next_before_id
    more = " (the first 1000: repeat for more)" if seen >= BULK_MAX else ""
    return f"{action}: {done} jobs, {refused} refused{more}"
