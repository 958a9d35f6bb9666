"""The dashboard as an ASGI application: pages, actions, the charts' JSON and /metrics.

Owns: the routes, the connection pool the pages read on (opened at the first request, so a
host application that mounts the dashboard needs no lifespan hook), and what every response
carries: the CSRF cookie and headers that forbid inline scripts and framing.

Invariants: every page and endpoint passes Access before it reads anything; every action is
a POST that passes the CSRF check and `may_act`, then calls pgqueue's public API, which
guards each change in its own statement. Templates escape every value (Jinja2 autoescape),
and scripts come only from /static (Content-Security-Policy), so a job's args or error
holding `<script>` render as text.

Fails: a database that cannot be reached is a 503 page saying so; a filter typed wrong is
shown on the jobs page; an action on a job in the wrong state says why. None of them is a
raw traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from pgqueue.dashboard import pages, series
from pgqueue.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    NEW_CSRF,
    TOKEN_COOKIE,
    Access,
    csrf_token,
    csrf_valid,
)
from pgqueue.errors import PgQueueError
from pgqueue.models import JobStatus
from pgqueue.queue import Queue

HERE = Path(__file__).parent
BULK_MAX = 1000  # jobs one bulk action changes; the operator repeats it for more
RETRYABLE = (JobStatus.FAILED, JobStatus.CANCELLED)
CANCELLABLE = (
    JobStatus.QUEUED,
    JobStatus.SCHEDULED,
    JobStatus.RUNNING,
    JobStatus.WAITING,
    JobStatus.BLOCKED,
)
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


class Dashboard:
    """The dashboard of one pgqueue schema. `dsn` is read with (the read role will do);
    `actions_dsn`, if given, is what actions run with (a role granted `operator`)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "pgqueue",
        access: Access | None = None,
        actions_dsn: str | None = None,
        horizon_warning: timedelta = pages.HORIZON_WARNING,
    ) -> None:
        self.schema = Queue(schema=schema).schema
        self.queue = Queue(schema=schema)
        self.access = access or Access()
        self.horizon_warning = horizon_warning
        self.series = series.Series(self.schema)
        self._dsns = {"read": dsn, "act": actions_dsn or dsn}
        self._pools: dict[str, ConnectionPool] = {}
        self._lock = threading.Lock()
        self._metrics: Any = None

    def pool(self, kind: str = "read") -> ConnectionPool:
        with self._lock:
            if kind not in self._pools:
                pool = ConnectionPool(
                    self._dsns[kind],
                    min_size=1,
                    max_size=4,
                    kwargs={"autocommit": True, "application_name": f"pgqueue:dashboard-{kind}"},
                    open=False,
                    name=f"pgqueue-dashboard-{kind}",
                )
                pool.open(wait=False)
                self._pools[kind] = pool
            return self._pools[kind]

    def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.pool().connection(timeout=10) as conn:
            return fn(conn, *args)

    def act(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.pool("act").connection(timeout=10) as conn:
            return fn(conn, *args)

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                pool.close()
            self._pools.clear()
        if self._metrics is not None:
            self._metrics.close()

    def metrics_text(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from pgqueue.metrics import DatabaseCollector

        with self._lock:
            if self._metrics is None:
                registry = CollectorRegistry()
                self._metrics = DatabaseCollector(self._dsns["read"], self.schema)
                registry.register(self._metrics)
                self._registry = registry
        return generate_latest(self._registry), CONTENT_TYPE_LATEST


def create_app(
    dsn: str,
    *,
    schema: str = "pgqueue",
    allow_actions: bool = False,
    token: str | None = None,
    basic_auth: tuple[str, str] | None = None,
    authorize: Callable[[Request], bool] | None = None,
    actions_dsn: str | None = None,
    horizon_warning: timedelta = pages.HORIZON_WARNING,
) -> Starlette:
    """The dashboard as an ASGI app: serve it with `pgqueue dashboard`, or mount it in your
    own (`app.mount("/queue", create_app(...))`). Read-only unless `allow_actions`, which
    needs a `token`, `basic_auth`, or your own `authorize(request) -> bool`.
    `app.state.dashboard.close()` closes its connections."""
    access = Access(allow_actions, token, basic_auth, authorize)
    board = Dashboard(
        dsn,
        schema=schema,
        access=access,
        actions_dsn=actions_dsn,
        horizon_warning=horizon_warning,
    )
    views = _Views(board)
    app = Starlette(
        routes=[
            Route("/", views.queues, name="queues"),
            Route("/jobs", views.jobs, name="jobs"),
            Route("/jobs/bulk", views.bulk, methods=["POST"], name="bulk"),
            Route("/jobs/{job_id:int}", views.job, name="job"),
            Route(
                "/jobs/{job_id:int}/{action}", views.job_action, methods=["POST"], name="job_action"
            ),
            Route(
                "/queues/{queue}/{action}",
                views.queue_action,
                methods=["POST"],
                name="queue_action",
            ),
            Route("/workers", views.workers, name="workers"),
            Route("/tenants", views.tenants, name="tenants"),
            Route("/tenants", views.set_tenant, methods=["POST"], name="set_tenant"),
            Route("/recurring", views.recurring, name="recurring"),
            Route("/health", views.health, name="health"),
            Route("/api/series", views.api_series, name="api_series"),
            Route("/metrics", views.metrics, name="metrics"),
            Route("/login", views.login, methods=["GET", "POST"], name="login"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(_Guard, board=board)],
    )
    app.state.dashboard = board
    return app


class _Guard(BaseHTTPMiddleware):
    """Access first, then the CSRF cookie and security headers on whatever is answered."""

    def __init__(self, app: Any, board: Dashboard) -> None:
        super().__init__(app)
        self.board = board

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        open_paths = ("/login", "/static/")
        path = request.url.path[len(request.scope.get("root_path", "")) :]
        if not path.startswith(open_paths) and not self.board.access.allows(request):
            response = _refused(request, self.board.access)
        else:
            response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        new = request.scope.get(NEW_CSRF)
        if new is not None:
            response.set_cookie(
                CSRF_COOKIE, new, httponly=True, samesite="strict", path=_root(request)
            )
        return response


def _root(request: Request) -> str:
    return str(request.scope.get("root_path") or "") + "/"


def _refused(request: Request, access: Access) -> Response:
    if access.basic is not None:
        return Response(
            "authentication required",
            status_code=401,
            headers={"www-authenticate": 'Basic realm="pgqueue", charset="UTF-8"'},
        )
    if access.token is not None and request.method == "GET":
        return RedirectResponse(str(request.url_for("login")), status_code=303)
    return Response("authentication required", status_code=401)


class _Views:
    def __init__(self, board: Dashboard) -> None:
        self.board = board
        self.templates = Jinja2Templates(directory=HERE / "templates")
        env = self.templates.env
        env.filters["ago"] = _ago
        env.filters["when"] = _when
        env.filters["seconds"] = _seconds
        env.globals["pretty"] = pages.pretty

    # -- rendering --------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        context |= {
            "can_act": self.board.access.may_act(request),
            "actions_on": self.board.access.allow_actions,
            "csrf": csrf_token(request),
            "csrf_field": CSRF_FIELD,
            "note": request.query_params.get("note", "")[:500],
            "schema": self.board.schema,
        }
        return self.templates.TemplateResponse(request, template, context, status_code=status)

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
        samples = await run_in_threadpool(self.board.read, self.board.series.read)
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
        response = RedirectResponse(str(request.url_for("queues")), status_code=303)
        response.set_cookie(
            TOKEN_COOKIE, given, httponly=True, samesite="strict", path=_root(request)
        )
        return response

    # -- actions ----------------------------------------------------------------------------

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
        back = str(form.get("back", "")) or str(request.url_for("queues"))
        if not back.startswith(_root(request)):
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
