"""The project's side of the Django integration: its PGQUEUE setting, the Queue it names,
and Django's connection under it, which the app, the `django.tasks` backend and a task's run
in a worker all read. Every function reads Django's settings when called, never at import.
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
