"""`manage.py pgqueue_worker [options]`: `pgqueue worker` for the project's Queue on the
project's database, with Django set up, so tasks use the ORM. Takes the worker's options
(`pgqueue worker --help`).

Logging: Django has configured it from LOGGING. The worker adds its stderr handler to the
root logger, as `pgqueue worker` does, unless LOGGING gave the root one; that handler skips
a record a console handler on its way already printed (Django's "console" handler of the
"django" logger prints django.tasks records when DEBUG is on), so each line shows once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

# As `pgqueue worker` prints its lines (pgqueue.cli.main).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Command(BaseCommand):
    help = "Run a pgqueue worker for the project's Queue (takes `pgqueue worker` options)."

    def run_from_argv(self, argv: list[str]) -> None:
        # The worker's own parser reads its options: Django's would refuse them.
        from pgqueue import cli
        from pgqueue.cli import parser
        from pgqueue.contrib import django as integration

        spec = integration.settings()["QUEUE"]
        rest = argv[2:]
        if "--dsn" not in rest:
            rest = ["--dsn", integration.dsn(), *rest]
        if "--schema" not in rest:
            rest = ["--schema", integration.queue().schema, *rest]
        worker_args = ["worker", spec, *rest]
        options, _ = parser.build().parse_known_args(worker_args)
        log_to_stderr(options.log_level.upper())
        sys.exit(cli.main(worker_args))

    def handle(self, *args: Any, **options: Any) -> None:
        # Reached only through call_command(), whose parser is Django's.
        raise CommandError("run it as `manage.py pgqueue_worker [worker options]`")


def log_to_stderr(level: str) -> None:
    """The worker's stderr handler on the root logger, unless LOGGING configured one there
    (the worker's own basicConfig then leaves the root alone)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(NotOnTheConsoleYet())
    root.addHandler(handler)
    root.setLevel(level)


class NotOnTheConsoleYet(logging.Filter):
    """Passes a record unless a handler printing to stderr or stdout, on a logger between
    the record's and the root, already printed it."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger: logging.Logger | None = logging.getLogger(record.name)
        root = logging.getLogger()
        while logger is not None and logger is not root:
            if any(_printed(handler, record) for handler in logger.handlers):
                return False
            logger = logger.parent if logger.propagate else None
        return True


def _printed(handler: logging.Handler, record: logging.LogRecord) -> bool:
    console = (
        isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
        and handler.stream in (sys.stderr, sys.stdout)
    )
    return console and record.levelno >= handler.level and bool(handler.filter(record))
