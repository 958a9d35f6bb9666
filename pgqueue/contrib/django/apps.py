"""The Django app: at startup, the project's Queue runs calls given no `conn=` on Django's
connection (pgqueue.contrib.django.connection), and, where TASKS names pgqueue's backend,
its workers learn to find django.tasks tasks."""

from __future__ import annotations

from django.apps import AppConfig


class PgqueueConfig(AppConfig):
    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"

    def ready(self) -> None:
        from pgqueue.contrib import django as integration

        integration.queue().use_connection(integration.connection)
        if _uses_tasks_backend():
            from pgqueue.contrib.django import tasks

            tasks.install()


def _uses_tasks_backend() -> bool:
    """Whether TASKS names pgqueue's django.tasks backend (Django 6 and later)."""
    from django.conf import settings

    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict):
        return False
    try:
        from pgqueue.contrib.django.tasks import is_pgqueue_backend
    except ImportError:  # a Django without django.tasks
        return False
    # A broken entry is Django's to report, when it is used.
    return any(
        isinstance(params, dict) and is_pgqueue_backend(params.get("BACKEND"))
        for params in configured.values()
    )
