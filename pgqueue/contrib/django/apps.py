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
        from pgqueue.contrib.django.tasks import Backend
    except ImportError:  # a Django without django.tasks
        return False
    from django.utils.module_loading import import_string

    for params in configured.values():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django reports a broken TASKS setting itself, when it is used
        if isinstance(backend, type) and issubclass(backend, Backend):
            return True
    return False
