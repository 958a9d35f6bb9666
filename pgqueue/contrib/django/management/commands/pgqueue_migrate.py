"""`manage.py pgqueue_migrate`: apply pgqueue's pending migrations to the project's database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or upgrade pgqueue's tables in the project's database."

    def handle(self, *args: Any, **options: Any) -> None:
        from pgqueue import migrate
        from pgqueue.contrib import django as integration

        schema = integration.queue().schema
        applied = migrate.apply(integration.connection(), schema)
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "nothing to apply"
        self.stdout.write(f"pgqueue schema {schema}: {names}")
