"""The `pgqueue` command. The only module that reads argv and the environment.

Exit codes: 0 done, 1 the work failed, 2 the command line or configuration is wrong.
Without a DSN (--dsn, PGQUEUE_DSN, DATABASE_URL) commands use the embedded PostgreSQL kept
under ./.pgqueue/ and say so on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import migrate as migrations
from pgqueue.errors import ConfigurationError, PgQueueError
from pgqueue.models import QUEUE_NAME, SCHEMA_NAME, WorkerSettings, check_name
from pgqueue.queue import AsyncQueue, Queue

EMBEDDED_DIR = Path(".pgqueue") / "pgdata"


class UsageError(PgQueueError):
    """A malformed command line: exit code 2."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.handler(args)
        return code
    except (UsageError, ConfigurationError) as exc:
        print(f"pgqueue: error: {exc}", file=sys.stderr)
        return 2
    except PgQueueError as exc:
        print(f"pgqueue: error: {exc}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        print(f"pgqueue: database error: {type(exc).__name__}: {exc}".strip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgqueue", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dsn",
            help="PostgreSQL DSN (default: PGQUEUE_DSN, DATABASE_URL, "
            "else the embedded server in ./.pgqueue/)",
        )
        p.add_argument("--schema", type=_schema, help="schema of the pgqueue tables")

    p = sub.add_parser("migrate", help="create or upgrade the pgqueue tables")
    common(p)
    p.add_argument("--sql", action="store_true", help="print the pending SQL, apply nothing")
    p.set_defaults(handler=_migrate)

    p = sub.add_parser("worker", help="run jobs of the tasks registered on MODULE:ATTR")
    common(p)
    p.add_argument("app", metavar="MODULE:ATTR", help="a pgqueue Queue or AsyncQueue")
    p.add_argument("--queues", type=_queues, default=None, help="comma-separated queue names")
    p.add_argument("--concurrency", type=_positive_int, default=10)
    p.add_argument("--batch-size", type=_positive_int, default=None)
    p.add_argument("--burst", action="store_true", help="exit once the queues are empty")
    p.add_argument(
        "--poll-only",
        action="store_true",
        help="no LISTEN and no prepared statements (PgBouncer transaction mode)",
    )
    p.add_argument("--poll-interval", type=_positive_float, default=1.0, metavar="SECONDS")
    p.add_argument("--shutdown-grace", type=_non_negative_float, default=30.0, metavar="SECONDS")
    p.set_defaults(handler=_worker)

    p = sub.add_parser("demo", help="show transactional enqueue on a small table")
    common(p)
    p.add_argument("--jobs", type=_positive_int, default=2000)
    p.add_argument("--concurrency", type=_positive_int, default=50)
    p.set_defaults(handler=_demo)
    return parser


# -- argument types: a malformed value is an argparse error (exit 2) naming the option ------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of 0 or more")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _queues(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(","))
    try:
        for name in names:
            check_name("queue", name, QUEUE_NAME)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return names


def _schema(text: str) -> str:
    try:
        return check_name("schema", text, SCHEMA_NAME)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- shared steps ----------------------------------------------------------------------------


def resolve_dsn(given: str | None) -> str:
    """--dsn, then PGQUEUE_DSN, then DATABASE_URL, else start the embedded server."""
    dsn = given or os.environ.get("PGQUEUE_DSN") or os.environ.get("DATABASE_URL")
    if dsn:
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise UsageError(f"invalid DSN: {exc}".strip()) from None
        return dsn
    from pgqueue import embedded

    print(
        f"pgqueue: no DSN given; using the embedded PostgreSQL in ./{EMBEDDED_DIR}/",
        file=sys.stderr,
    )
    return embedded.start(EMBEDDED_DIR).dsn


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise PgQueueError(f"cannot connect to the database: {exc}".strip()) from None


def load_app(spec: str) -> Queue | AsyncQueue:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{spec!r} is not MODULE:ATTR (for example myapp.jobs:queue)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    try:
        app = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(app, (Queue, AsyncQueue)):
        raise UsageError(f"{spec} is a {type(app).__name__}, not a pgqueue Queue or AsyncQueue")
    return app


# -- commands --------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    schema = args.schema or "pgqueue"
    with connect(resolve_dsn(args.dsn)) as conn:
        if args.sql:
            print(migrations.render(schema, migrations.pending(conn, schema)), end="")
            return 0
        applied = migrations.apply(conn, schema)
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none (up to date)"
    print(f"schema {schema}: applied {names}", file=sys.stderr)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from pgqueue.worker import Worker

    app = load_app(args.app)
    options: dict[str, Any] = {
        "concurrency": args.concurrency,
        "burst": args.burst,
        "poll_only": args.poll_only,
        "poll_interval": args.poll_interval,
        "shutdown_grace": args.shutdown_grace,
    }
    if args.queues:
        options["queues"] = args.queues
    if args.batch_size:
        options["batch_size"] = args.batch_size
    settings = WorkerSettings(**options)
    worker = Worker(app, dsn=resolve_dsn(args.dsn), settings=settings, schema=args.schema)
    worker.run()
    if worker.abandoned_threads:
        # Sync handlers cannot be interrupted; their jobs were put back (the stop went as
        # designed, hence 0). Waiting for their threads could take forever: leave now.
        logging.shutdown()
        os._exit(0)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from pgqueue import demo

    return demo.run(
        resolve_dsn(args.dsn),
        jobs=args.jobs,
        concurrency=args.concurrency,
        schema=args.schema or "pgqueue_demo",
    )
