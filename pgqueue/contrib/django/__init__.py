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

import importlib
from typing import Any

import psycopg

from pgqueue.errors import ConfigurationError
from pgqueue.queue import Queue


def settings() -> dict[str, Any]:
    """The project's PGQUEUE setting, checked."""
    from django.conf import settings as django_settings

    given = getattr(django_settings, "PGQUEUE", None)
    if not isinstance(given, dict) or not isinstance(given.get("QUEUE"), str):
        raise ConfigurationError(
            'set PGQUEUE = {"QUEUE": "yourapp.jobs:queue"} in your Django settings: the Queue '
            "your tasks are registered on"
        )
    return given


def alias() -> str:
    """The Django database pgqueue uses."""
    return str(settings().get("DATABASE", "default"))


def queue() -> Queue:
    """The project's Queue, named by PGQUEUE["QUEUE"] as "module:attribute"."""
    spec = settings()["QUEUE"]
    module_name, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr or "queue")
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f'PGQUEUE["QUEUE"] = {spec!r} cannot be loaded: {exc}') from exc
    if not isinstance(found, Queue):
        raise ConfigurationError(
            f'PGQUEUE["QUEUE"] = {spec!r} is a {type(found).__name__}, not a pgqueue Queue'
        )
    return found


def connection() -> psycopg.Connection[Any]:
    """The psycopg connection under Django's, in whatever transaction Django has open."""
    from django.db import connections

    wrapper = connections[alias()]
    if wrapper.vendor != "postgresql":
        raise ConfigurationError(
            f"Django database {alias()!r} is {wrapper.vendor}: pgqueue needs PostgreSQL"
        )
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigurationError(
            f"Django database {alias()!r} runs on psycopg2: pgqueue shares psycopg 3's "
            "connection (pip install 'psycopg[binary]'; Django picks psycopg 3 when installed)"
        )
    return raw


def dsn() -> str:
    """A DSN for the same database, for the worker's own connections."""
    from django.db import connections

    params = connections[alias()].settings_dict
    given = {
        "dbname": params.get("NAME"),
        "user": params.get("USER"),
        "password": params.get("PASSWORD"),
        "host": params.get("HOST"),
        "port": params.get("PORT"),
    }
    options = params.get("OPTIONS") or {}
    given |= {k: v for k, v in options.items() if isinstance(v, (str, int)) and k != "pool"}
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in given.items() if v})


def __getattr__(name: str) -> Any:
    # The django.tasks backend needs Django 6: imported only when a project names it.
    if name == "Backend":
        from pgqueue.contrib.django.tasks import Backend

        return Backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
