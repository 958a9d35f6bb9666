"""`manage.py pgqueue_worker [options]`: `pgqueue worker` for the project's Queue on the
project's database, with Django set up, so tasks use the ORM. Takes the worker's options
(`pgqueue worker --help`)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Run a pgqueue worker for the project's Queue (takes `pgqueue worker` options)."

    def run_from_argv(self, argv: list[str]) -> None:
        # The worker's own parser reads its options: Django's would refuse them.
        from pgqueue import cli
        from pgqueue.contrib import django as integration

        spec = integration.settings()["QUEUE"]
        rest = argv[2:]
        if "--dsn" not in rest:
            rest = ["--dsn", integration.dsn(), *rest]
        if "--schema" not in rest:
            rest = ["--schema", integration.queue().schema, *rest]
        sys.exit(cli.main(["worker", spec, *rest]))

    def handle(self, *args: Any, **options: Any) -> None:
        # Reached only through call_command(), whose parser is Django's.
        raise CommandError("run it as `manage.py pgqueue_worker [worker options]`")
