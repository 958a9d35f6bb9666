"""`manage.py pgqueue_worker [options]`: `pgqueue worker` for the project's Queue on the
project's database, with Django set up, so tasks use the ORM. Takes the worker's options
(`pgqueue worker --help`; with --processes N each child is this command again) beside every
management command's own (--settings, --verbosity, --pythonpath, --traceback, ...), on
Django's parser. pgqueue's errors are CommandErrors with the exit codes of `pgqueue worker`:
2 for a bad option or setting, 1 for a failure.

Logging: Django has configured it from LOGGING. The worker adds its stderr handler to the
root logger, as `pgqueue worker` does, unless LOGGING gave the root one; that handler skips
a record a console handler on its way already printed (Django's "console" handler of the
"django" logger prints django.tasks records when DEBUG is on), so each line shows once.
--log-level sets its level; without it, --verbosity does (0 warning, 1 info, 2 and 3 debug).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgqueue.cli import argtypes, commands
from pgqueue.cli import parser as cli_parser
from pgqueue.cli.target import UsageError
from pgqueue.contrib import django as integration
from pgqueue.errors import ConfigurationError, PgQueueError

# As `pgqueue worker` prints its lines (pgqueue.cli.main).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVEL_OF_VERBOSITY = {0: "warning", 1: "info", 2: "debug", 3: "debug"}


class Command(BaseCommand):
    help = "Run a pgqueue worker for the project's Queue (takes `pgqueue worker` options)."
    # A worker starts whatever `manage.py check` would say: as in Django, a TASKS alias of
    # no use is reported only when it is used (tests/integration/test_django_tasks.py).
    requires_system_checks: tuple[str, ...] = ()

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--log-level",
            choices=cli_parser.LOG_LEVELS,
            help="how much to log on stderr (default: from --verbosity, info at 1)",
        )
        parser.add_argument(
            "--dsn", help="PostgreSQL DSN (default: that of PGQUEUE's Django database)"
        )
        parser.add_argument(
            "--schema",
            type=argtypes.schema,
            help="schema of the pgqueue tables (default: the project's Queue's)",
        )
        cli_parser.processes_option(parser)
        cli_parser.worker_options(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        level = options["log_level"] or LEVEL_OF_VERBOSITY.get(options["verbosity"], "info")
        log_to_stderr(level.upper())
        try:
            app = integration.queue()
            worker_args = argparse.Namespace(
                **{
                    **options,
                    "target": None,
                    "app": None,
                    "app_loaded": app,
                    "dsn": options["dsn"] or integration.dsn(),
                    "schema": options["schema"] or app.schema,
                    # --processes N: each child is this same management command.
                    "child_command": [sys.executable, *sys.argv],
                }
            )
            code = commands.worker(worker_args)
        except (UsageError, ConfigurationError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        except PgQueueError as exc:
            raise CommandError(str(exc), returncode=1) from exc
        except psycopg.Error as exc:
            raise CommandError(
                f"database error: {type(exc).__name__}: {exc}", returncode=1
            ) from exc
        if code:
            sys.exit(code)


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
