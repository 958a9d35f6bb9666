"""The Django app: at startup, the project's Queue runs calls given no `conn=` on Django's
connection (pgqueue.contrib.django.connection)."""

from __future__ import annotations

from django.apps import AppConfig


class PgqueueConfig(AppConfig):
    name = "pgqueue.contrib.django"
    label = "pgqueue"
    verbose_name = "pgqueue"

    def ready(self) -> None:
        from pgqueue.contrib import django as integration

        integration.queue().use_connection(integration.connection)
