"""pgqueue's backend where Django's task tests configure DummyBackend or ImmediateBackend.

Those tests set TASKS themselves (override_settings); plugin.py passes every TASKS they set
through `pgqueue_tasks`, which names these backends instead of Django's two. Each is
pgqueue's own Backend, jobs in PostgreSQL and all, plus only what the tests ask of the
Django backend it stands in for.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections
from django.tasks import TaskResult
from psycopg import sql

from pgqueue.contrib import django as integration
from pgqueue.contrib.django.tasks import Backend
from pgqueue.worker.worker import Worker

STANDS_IN_FOR = {
    "django.tasks.backends.dummy.DummyBackend": f"{__name__}.StoredBackend",
    "django.tasks.backends.immediate.ImmediateBackend": f"{__name__}.WorkedBackend",
}


def pgqueue_tasks(configured: Any) -> Any:
    """TASKS with pgqueue's backends in the place of Django's two; other entries as given
    (a broken one included: Django reports it when it is used)."""
    if not isinstance(configured, dict):
        return configured
    return {alias: _stand_in(params) for alias, params in configured.items()}


def _stand_in(params: Any) -> Any:
    if not isinstance(params, dict) or params.get("BACKEND") not in STANDS_IN_FOR:
        return params
    return {**params, "BACKEND": STANDS_IN_FOR[params["BACKEND"]]}


class StoredBackend(Backend):
    """For DummyBackend's tests: jobs are stored, and no worker runs them. What those tests
    read of DummyBackend, `results` and `clear()`, is read from and done to the database."""

    @property
    def results(self) -> list[TaskResult]:
        """The results of this alias's jobs, oldest first. Read in a thread of its own: the
        tests read it in async tests too, where Django's connection may not be used."""
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(self._stored_results).result()

    def _stored_results(self) -> list[TaskResult]:
        try:
            return self._read_results()
        finally:
            connections.close_all()  # this thread's

    def _read_results(self) -> list[TaskResult]:
        ids = sql.SQL(
            "SELECT id FROM {schema}.jobs WHERE args ->> 'backend' = %(alias)s"
            " UNION ALL SELECT id FROM {schema}.job_history WHERE args ->> 'backend' = %(alias)s"
            " ORDER BY id"
        ).format(schema=sql.Identifier(integration.queue().schema))
        rows = integration.connection().execute(ids, {"alias": self.alias}).fetchall()
        return [self.get_result(str(row[0])) for row in rows]

    def clear(self) -> None:
        """Delete this alias's jobs."""
        schema = sql.Identifier(integration.queue().schema)
        for table in ("jobs", "job_history"):
            delete = sql.SQL("DELETE FROM {}.{} WHERE args ->> 'backend' = %(alias)s").format(
                schema, sql.Identifier(table)
            )
            integration.connection().execute(delete, {"alias": self.alias})


class WorkedBackend(Backend):
    """For ImmediateBackend's tests, which expect enqueue() to return the task's outcome:
    enqueue() stores the job, then a real pgqueue worker runs it (in burst mode, in this
    process, so the tests see django.tasks' log records), and the result is read back. The
    worker has a thread of its own, as far from the enqueuing call as its own process would
    be: none of asgiref's context of an async test reaches it."""

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> TaskResult:
        enqueued = super().enqueue(task, args, kwargs)
        worker = Worker(
            integration.queue(),
            dsn=integration.dsn(),
            queues=(task.queue_name,),
            concurrency=1,
            burst=True,
            periodic=False,
        )
        thread = threading.Thread(target=asyncio.run, args=(worker.run_async(),))
        thread.start()
        thread.join()
        return self.get_result(enqueued.id)
