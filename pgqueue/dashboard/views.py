"""The dashboard's pages: each reads through pages.py on the read pool and renders its
template; the login form; the charts' JSON and /metrics.

Invariants: templates escape every value (Jinja2 autoescape), and every page carries the CSRF
token its forms send back. A template that names something its data lacks fails loudly
(StrictUndefined) rather than drawing an empty or wrong value. A database that cannot be
reached is a 503 page saying so, a filter typed wrong a 400 saying which; never a raw
traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
from jinja2 import StrictUndefined, UndefinedError
from psycopg_pool import PoolTimeout
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from pgqueue.dashboard import pages, series, workflows
from pgqueue.dashboard.board import Dashboard
from pgqueue.dashboard.security import CSRF_FIELD, TOKEN_COOKIE, csrf_token, csrf_valid
from pgqueue.errors import PgQueueError

TEMPLATES = Path(__file__).parent / "templates"
# What a schema not migrated (or migrated by an older pgqueue) answers.
MISSING = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
)


def root(request: Request) -> str:
    """The path the dashboard is mounted at, for its cookies and the redirects of actions."""
    return str(request.scope.get("root_path") or "") + "/"


def set_cookie(response: Response, request: Request, name: str, value: str) -> None:
    """One of the dashboard's cookies: for its own path, out of scripts' reach, never sent
    by another site's request, and only over HTTPS when served over HTTPS."""
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=root(request),
    )


class Views:
    def __init__(self, board: Dashboard) -> None:
        self.board = board
        self.templates = Jinja2Templates(directory=TEMPLATES)
        env = self.templates.env
        env.undefined = StrictUndefined
        env.filters["ago"] = _ago
        env.filters["when"] = _when
        env.filters["seconds"] = _seconds
        env.globals["pretty"] = pages.pretty
        env.globals["compact"] = pages.compact

    # -- rendering --------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        can_act = self.board.access.may_act(request)
        context |= {
            "can_act": can_act,
            "cannot_act_why": None if can_act else self.cannot_act_why(),
            "actions_on": self.board.access.allow_actions,
            "csrf": csrf_token(request),
            "csrf_field": CSRF_FIELD,
            "note": request.query_params.get("note", "")[:500],
            "schema": self.board.schema,
        }
        try:
            return self.templates.TemplateResponse(request, template, context, status_code=status)
        except UndefinedError as exc:
            if template == "error.html":
                raise
            # A page that names what its data lacks is a bug of the dashboard: say which.
            problem = f"the dashboard's page {template} cannot be drawn: {exc}; please report it"
            return self.render(request, "error.html", 500, problem=problem)

    def cannot_act_why(self) -> str:
        """What a viewer who may not act is told on each disabled button."""
        if not self.board.access.allow_actions:
            return "Read-only: this dashboard was started without --allow-actions"
        return "Sign in to act: actions need authentication"

    async def page(
        self,
        request: Request,
        template: str,
        fn: Callable[..., Any],
        *args: Any,
        missing: str | None = None,
        **context: Any,
    ) -> Response:
        """`template` with what `fn` read; a 404 saying `missing` if that is None."""
        try:
            data = await run_in_threadpool(self.board.read, fn, *args)
        except (psycopg.OperationalError, PoolTimeout) as exc:
            return self.render(request, "error.html", 503, problem=f"database unreachable: {exc}")
        except pages.FilterError as exc:
            return self.render(request, "error.html", 400, problem=str(exc))
        except PgQueueError as exc:
            return self.render(request, "error.html", 500, problem=str(exc))
        except MISSING as exc:
            schema = self.board.schema
            problem = (
                f"schema {schema!r} lacks pgqueue's tables ({exc.diag.message_primary}): run "
                f"`pgqueue migrate --schema {schema}`"
            )
            return self.render(request, "error.html", 500, problem=problem)
        except psycopg.Error as exc:
            problem = f"database error: {type(exc).__name__}: {exc}".strip()
            return self.render(request, "error.html", 500, problem=problem)
        if data is None and missing is not None:
            return self.render(request, "error.html", 404, problem=missing)
        return self.render(request, template, data=data, **context)

    # -- pages ------------------------------------------------------------------------------

    async def queues(self, request: Request) -> Response:
        return await self.page(request, "queues.html", pages.queues, self.board.schema)

    async def jobs(self, request: Request) -> Response:
        form = pages.JobFilterForm.read(request.query_params)
        try:
            form.filters()
        except pages.FilterError as exc:
            return self.render(request, "jobs.html", 400, data=None, form=form, problem=str(exc))
        return await self.page(
            request, "jobs.html", pages.jobs, self.board.queue, form, form=form, problem=None
        )

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        return await self.page(
            request, "job.html", pages.job, self.board.queue, job_id, missing=f"no job {job_id}"
        )

    async def workflow(self, request: Request) -> Response:
        workflow_id = request.path_params["workflow_id"]
        return await self.page(
            request,
            "workflow.html",
            workflows.read,
            self.board.schema,
            workflow_id,
            request.query_params.get("after", ""),
            missing=f"no workflow {workflow_id}: no job, live or finished, belongs to it",
        )

    async def workers(self, request: Request) -> Response:
        return await self.page(request, "workers.html", pages.workers, self.board.schema)

    async def tenants(self, request: Request) -> Response:
        return await self.page(request, "tenants.html", pages.tenants, self.board.queue)

    async def recurring(self, request: Request) -> Response:
        return await self.page(request, "recurring.html", pages.recurring, self.board.schema)

    async def health(self, request: Request) -> Response:
        return await self.page(
            request, "health.html", pages.health_page, self.board.schema, self.board.horizon_warning
        )

    async def api_series(self, request: Request) -> Response:
        try:
            samples = await run_in_threadpool(self.board.read, self.board.series.read)
        except (psycopg.OperationalError, PoolTimeout, PgQueueError) as exc:
            return JSONResponse({"error": f"cannot read the database: {exc}"}, status_code=503)
        return JSONResponse(series.as_json(samples))

    async def metrics(self, request: Request) -> Response:
        body, kind = await run_in_threadpool(self.board.metrics_text)
        return Response(body, media_type=kind)

    async def login(self, request: Request) -> Response:
        access = self.board.access
        if request.method == "GET" or access.token is None:
            return self.render(request, "login.html", token_login=access.token is not None)
        form = await request.form()
        if not csrf_valid(request, form.get(CSRF_FIELD)):
            return self.render(request, "error.html", 403, problem="the form expired: reload")
        given = str(form.get("token", ""))
        if not access.token_matches(given):
            return self.render(
                request,
                "login.html",
                401,
                token_login=True,
                problem="that token is not this dashboard's",
            )
        response = RedirectResponse(str(request.url_for("queues")), status_code=303)
        set_cookie(response, request, TOKEN_COOKIE, given)
        return response


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return _seconds(datetime.now(timezone.utc) - moment) + " ago"


def _seconds(span: timedelta | float | None) -> str:
    if span is None:
        return "-"
    seconds = span.total_seconds() if isinstance(span, timedelta) else float(span)
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    if abs(seconds) < 120:
        return f"{seconds:.1f} s"
    if abs(seconds) < 7200:
        return f"{seconds / 60:.0f} min"
    if abs(seconds) < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} d"


def _when(moment: datetime | None) -> str:
    return (
        "-" if moment is None else moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    )
