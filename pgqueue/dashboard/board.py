"""The dashboard of one schema, as its pages and actions reach the database.

Owns: the connection pools (reads, and actions, which may run as another role), opened at the
first request so a host application that mounts the dashboard needs no lifespan hook; the
Queue whose calls take their connections; the /metrics registry, made at the first scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from psycopg_pool import ConnectionPool

from pgqueue.dashboard import pages, series
from pgqueue.dashboard.security import Access
from pgqueue.queue import Queue


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
        self.queue = Queue(schema=schema)  # its calls take the pools' connections
        self.schema = self.queue.schema
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
