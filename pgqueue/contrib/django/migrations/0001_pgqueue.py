"""Applies pgqueue's own migrations to its schema, so that `manage.py migrate` sets pgqueue
up. A later pgqueue with new migrations: run `manage.py pgqueue_migrate`."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def apply(apps: Any, schema_editor: Any) -> None:
    from pgqueue import migrate
    from pgqueue.contrib import django as integration

    if schema_editor.connection.alias != integration.alias():
        return
    migrate.apply(integration.connection(), integration.queue().schema)


class Migration(migrations.Migration):
    # pgqueue's migrations run in a transaction of their own, under their own lock.
    atomic = False
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(apply, migrations.RunPython.noop)]
