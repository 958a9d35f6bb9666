"""The web dashboard: queues, jobs, workers, tenants, recurring jobs and the database's
health, with retry, cancel, pause and tenant limits as actions, and /metrics.

Serve it with `pgqueue dashboard`, or mount `create_app(...)` in your own ASGI application.
Needs the `dashboard` extra; the core never imports this package.
"""

from pgqueue.dashboard.app import create_app
from pgqueue.dashboard.board import Dashboard
from pgqueue.dashboard.security import Access

__all__ = ["Access", "Dashboard", "create_app"]
