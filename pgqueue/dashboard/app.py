"""The dashboard as an ASGI application: its routes, its connections, and what every
response carries.

Owns: the routes (pages in views.py, actions in actions.py, over the Dashboard of board.py)
and the guard in front of them all.

Invariants: every request but the login form and static files passes Access before any view
runs. Every response carries the CSRF cookie when the browser has none, and headers that
forbid inline scripts and framing: scripts come only from /static, so a job's args or error
holding `<script>` cannot run even if a template forgot to escape it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgqueue.dashboard import pages
from pgqueue.dashboard.actions import Actions
from pgqueue.dashboard.board import Dashboard
from pgqueue.dashboard.security import (
    CSRF_COOKIE,
    NEW_CSRF,
    Access,
)
from pgqueue.dashboard.views import set_cookie

HERE = Path(__file__).parent
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


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
    needs a `token` (16 characters or more), `basic_auth`, or your own
    `authorize(request) -> bool`.
    `app.state.dashboard.close()` closes its connections."""
    access = Access(allow_actions, token, basic_auth, authorize)
    board = Dashboard(
        dsn,
        schema=schema,
        access=access,
        actions_dsn=actions_dsn,
        horizon_warning=horizon_warning,
    )
    views = Actions(board)
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
            Route("/workflows/{workflow_id:int}", views.workflow, name="workflow"),
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
        started = time.perf_counter()
        open_paths = ("/login", "/static/")
        path = request.url.path[len(request.scope.get("root_path", "")) :]
        if not path.startswith(open_paths) and not self.board.access.allows(request):
            response = _refused(request, self.board.access)
        else:
            response = await call_next(request)
        # The page's time in the dashboard, database included: browsers' developer tools
        # show it, and bench/dashboard/suite.py reads it.
        elapsed = (time.perf_counter() - started) * 1000
        response.headers["server-timing"] = f"app;dur={elapsed:.2f}"
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        new = request.scope.get(NEW_CSRF)
        if new is not None:
            set_cookie(response, request, CSRF_COOKIE, new)
        return response


def _refused(request: Request, access: Access) -> Response:
    if access.basic is not None:
        return Response(
            "authentication required",
            status_code=401,
            headers={"www-authenticate": 'Basic realm="pgqueue", charset="UTF-8"'},
        )
    # A browser is sent to the login form; a scraper or script gets the 401 it can act on.
    browsing = "text/html" in request.headers.get("accept", "")
    if access.token is not None and request.method == "GET" and browsing:
        return RedirectResponse(str(request.url_for("login")), status_code=303)
    return Response("authentication required", status_code=401)
