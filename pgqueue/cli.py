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
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from pgqueue import health
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


WATCHDOG_HELP = """\
Report sessions, replication slots and prepared transactions that have held back the
xmin horizon for at least --max-age: while they do, VACUUM cannot remove the jobs table's
dead rows and claims slow down. A dry run by default: it prints what it would terminate.
With --terminate it ends those sessions with pg_terminate_backend, never this connection,
pgqueue's own connections (application_name pgqueue:...) or non-client backends. Prepared
transactions and replication slots are only reported (slots have no start time, so they
are never over --max-age: see `pgqueue status`).

exit status:
  0  nothing held the horizon for --max-age, or --terminate ended all that did
  1  database error
  2  bad command line
  3  holders over the limit found (dry run), or some could not be terminated
"""


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
    p.add_argument(
        "--heartbeat-interval",
        type=_positive_float,
        metavar="SECONDS",
        help="how often the worker proves itself alive (default 5)",
    )
    p.add_argument(
        "--lease-timeout",
        type=_positive_float,
        metavar="SECONDS",
        help="silence after which a worker's jobs are rescued (default 30)",
    )
    p.add_argument(
        "--rescue-interval",
        type=_positive_float,
        metavar="SECONDS",
        help="how often to look for dead workers' jobs (default 10)",
    )
    p.add_argument(
        "--atomic-concurrency",
        type=_non_negative_int,
        metavar="N",
        help="atomic jobs run at once, each holding a transaction (default 2)",
    )

    p.set_defaults(handler=_worker)

    p = sub.add_parser("grant", help="grant a role what a worker or an app needs, nothing more")
    common(p)
    p.add_argument("role", type=_role_name, help="an existing role")
    p.add_argument("--kind", choices=["worker", "app"], required=True)
    p.add_argument("--sql", action="store_true", help="print the GRANT statements only")
    p.set_defaults(handler=_grant)

    p = sub.add_parser("demo", help="show transactional enqueue on a small table")
    common(p)
    p.add_argument("--jobs", type=_positive_int, default=2000)
    p.add_argument("--concurrency", type=_positive_int, default=50)
    p.set_defaults(handler=_demo)

    p = sub.add_parser(
        "status",
        help="queue counts and what holds back VACUUM",
        description="Per-queue counts, the oldest sessions, replication slots and prepared "
        "transactions holding back the xmin horizon, and the jobs table's dead rows.",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_status)

    p = sub.add_parser(
        "watchdog",
        help="report (and optionally end) transactions holding the xmin horizon too long",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=WATCHDOG_HELP,
    )
    p.add_argument(
        "--dsn",
        help="PostgreSQL DSN (default: PGQUEUE_DSN, DATABASE_URL, "
        "else the embedded server in ./.pgqueue/)",
    )
    p.add_argument(
        "--max-age",
        type=_duration,
        required=True,
        metavar="DURATION",
        help="report holders at least this old: 90s, 10m, 1h, 1h30m or plain seconds",
    )
    p.add_argument(
        "--terminate",
        action="store_true",
        help="pg_terminate_backend the reported sessions (default: dry run)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_watchdog)
    return parser


# -- argument types: a malformed value is an argparse error (exit 2) naming the option ------


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not 0 or more")
    return value


def _role_name(text: str) -> str:
    if not 1 <= len(text) <= 63 or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a role name (1-63 characters)")
    return text  # quoted as an identifier by psycopg.sql, whatever it contains


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


_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def _duration(text: str) -> timedelta:
    """90s, 10m, 1h, 1h30m, 1h30m15s, or plain seconds (90, 2.5)."""
    try:
        if _SECONDS.fullmatch(text):
            return timedelta(seconds=float(text))
        match = _DURATION.fullmatch(text)
        if match and any(match.groups()):
            hours, minutes, seconds = (float(part or 0) for part in match.groups())
            return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        pass
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a duration such as 90s, 10m, 1h, 1h30m or a number of seconds"
    )


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
    optional = {
        "queues": args.queues,
        "batch_size": args.batch_size,
        "heartbeat_interval": args.heartbeat_interval,
        "lease_timeout": args.lease_timeout,
        "rescue_interval": args.rescue_interval,
        "atomic_concurrency": args.atomic_concurrency,
    }
    options.update({name: value for name, value in optional.items() if value is not None})
    settings = WorkerSettings(**options)
    worker = Worker(app, dsn=resolve_dsn(args.dsn), settings=settings, schema=args.schema)
    worker.run()
    if worker.abandoned_threads:
        # Sync handlers cannot be interrupted; their jobs were put back (the stop went as
        # designed, hence 0). Waiting for their threads could take forever: leave now.
        logging.shutdown()
        os._exit(0)
    return 0


def _grant(args: argparse.Namespace) -> int:
    schema = args.schema or "pgqueue"
    if args.sql:
        print(migrations.grant_sql(schema, args.role, args.kind).as_string(None))
        return 0
    with connect(resolve_dsn(args.dsn)) as conn:
        migrations.grant_role(conn, schema, args.role, args.kind)
    print(f"granted {args.kind} privileges on schema {schema} to {args.role}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from pgqueue import demo

    return demo.run(
        resolve_dsn(args.dsn),
        jobs=args.jobs,
        concurrency=args.concurrency,
        schema=args.schema or "pgqueue_demo",
    )


def _status(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        report = health.status(conn, args.schema or "pgqueue")
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        _print_status(_console(), report)
    return 0


def _watchdog(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        report = health.watch(conn, args.max_age, act=args.terminate)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        _print_watchdog(_console(), report)
    return 0 if report.clear else 3


# -- how status and watchdog look in a terminal ----------------------------------------------


def _console() -> Console:
    # Query texts and application names are anyone's: print them as they are, not as markup.
    return Console(markup=False, emoji=False)


def _print_status(console: Console, report: health.Status) -> None:
    if report.queues:
        table = Table(title=f"queues in schema {report.schema_name}", title_justify="left")
        table.add_column("queue", no_wrap=True)
        for name in ("queued", "scheduled", "running", "failed 1h", "done/min", "oldest queued"):
            table.add_column(name, justify="right")
        for q in report.queues:
            counts = (q.queued, q.scheduled, q.running, q.failed_last_hour)
            table.add_row(
                q.queue,
                *(f"{n:,}" for n in (*counts, q.succeeded_last_minute)),
                _human(q.oldest_queued_age),
            )
        console.print(table)
    else:
        console.print(f"schema {report.schema_name}: no live jobs, none finished in the last hour")
    t = report.jobs_table
    console.print("\ndatabase health", style="bold")
    console.print(
        f"{t.schema_name}.{t.table_name}: {t.n_dead_tup:,} dead rows, {t.n_live_tup:,} live; "
        f"last autovacuum {_when(t.last_autovacuum)}, last vacuum {_when(t.last_vacuum)}"
    )
    if not any(h.kind == "session" for h in report.holders):
        console.print("no session holds back the xmin horizon")
    for kind, title in (
        ("session", "oldest sessions holding back the xmin horizon"),
        ("replication_slot", "replication slots holding back the xmin horizon"),
        ("prepared_xact", "prepared transactions holding back the xmin horizon"),
    ):
        holders = [h for h in report.holders if h.kind == kind]
        if holders:
            console.print(_holder_table(console, title, holders[:10]))
        if len(holders) > 10:
            console.print(f"... and {len(holders) - 10} more (see --json)")


def _print_watchdog(console: Console, report: health.WatchdogReport) -> None:
    limit = _human(report.max_age)
    if not report.holders:
        console.print(f"nothing has held back the xmin horizon for {limit} or more")
        return
    title = f"holding back the xmin horizon for {limit} or more"
    console.print(_holder_table(console, title, report.holders))
    if not report.acted:
        pids = [h.pid for h in report.holders if h.terminable]
        console.print(f"dry run: would terminate {_pids(pids)}; --terminate does it")
        return
    console.print(f"terminated {_pids(report.terminated)}")
    for h in report.remaining:
        what = f"pid {h.pid}" if h.pid is not None else f"{h.kind} {h.name}"
        console.print(f"still holding back the horizon: {what} ({h.application_name or h.kind})")


def _holder_table(console: Console, title: str, holders: Sequence[health.HorizonHolder]) -> Table:
    """Age (or, for a slot, the xids it holds), pid, state, application and query."""
    table = Table(title=title, title_justify="left")
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("state", min_width=7)
    table.add_column("application", overflow="fold", min_width=11)
    # A no_wrap column without max_width squeezes the others to nothing in rich.
    query_width = max(16, console.width - 56)
    table.add_column("query", no_wrap=True, overflow="ellipsis", max_width=query_width)
    for h in holders:
        xids = h.xmin_age if h.xmin_age is not None else h.catalog_xmin_age
        table.add_row(
            _human(h.age) if h.age is not None or xids is None else f"{xids:,} xids",
            "-" if h.pid is None else str(h.pid),
            h.state or "-",
            (h.application_name if h.kind == "session" else h.name) or "-",
            " ".join((h.query or "").split()) or "-",
        )
    return table


def _pids(pids: Sequence[int | None]) -> str:
    return "pid " + ", ".join(map(str, pids)) if pids else "nothing"


def _human(age: timedelta | None) -> str:
    """A duration for people: 4.2s, 3m12s, 2h05m, 3d04h."""
    if age is None:
        return "-"
    seconds = age.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else moment.isoformat(timespec="seconds")
