"""Django: pgqueue on Django's own connection, so a job commits and rolls back with the
`transaction.atomic()` block around it, savepoints included, with no `conn=`.

    INSTALLED_APPS = [..., "pgqueue.contrib.django"]
    PGQUEUE = {"QUEUE": "shop.jobs:queue"}          # the Queue your tasks are registered on
    # optional: "DATABASE": "default", the alias of a PostgreSQL database on psycopg 3

With Django 6, `pgqueue.contrib.django.Backend` is a `django.tasks` backend
(pgqueue/contrib/django/tasks.py):

    TASKS = {"default": {"BACKEND": "pgqueue.contrib.django.Backend"}}

`manage.py migrate` applies pgqueue's migrations (this app's migration runs them), or
`manage.py pgqueue_migrate` does; `manage.py pgqueue_worker [worker options]` runs
`pgqueue worker` on the same database. The core never imports Django: this package is
imported only by a Django project that installs it.
"""

from __future__ import annotations

from typing import Any

from pgqueue.contrib.django.project import alias, connection, dsn, queue, settings

__all__ = ["alias", "connection", "dsn", "queue", "settings"]


def __getattr__(name: str) -> Any:
    # The django.tasks backend needs Django 6: imported only when a project names it.
    if name == "Backend":
        from pgqueue.contrib.django.tasks import Backend

        return Backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
