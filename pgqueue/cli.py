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

from pgqueue import argtypes, console, health
from pgqueue import migrate as migrations
from pgqueue.errors import ConfigurationError, JobNotFoundError, PgQueueError
from pgqueue.models import Cancellation, WorkerSettings
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
        p.add_argument("--schema", type=argtypes.schema, help="schema of the pgqueue tables")

    p = sub.add_parser("migrate", help="create or upgrade the pgqueue tables")
    common(p)
    p.add_argument("--sql", action="store_true", help="print the pending SQL, apply nothing")
    p.set_defaults(handler=_migrate)

    p = sub.add_parser("worker", help="run jobs of the tasks registered on MODULE:ATTR")
    common(p)
    p.add_argument("app", metavar="MODULE:ATTR", help="a pgqueue Queue or AsyncQueue")
    p.add_argument(
        "--queues", type=argtypes.queues, default=None, help="comma-separated queue names"
    )
    p.add_argument("--concurrency", type=argtypes.positive_int, default=10)
    p.add_argument("--batch-size", type=argtypes.positive_int, default=None)
    p.add_argument("--burst", action="store_true", help="exit once the queues are empty")
    p.add_argument(
        "--poll-only",
        action="store_true",
        help="no LISTEN and no prepared statements (PgBouncer transaction mode)",
    )
    p.add_argument("--poll-interval", type=argtypes.positive_float, default=1.0, metavar="SECONDS")
    p.add_argument(
        "--shutdown-grace", type=argtypes.non_negative_float, default=30.0, metavar="SECONDS"
    )
    p.add_argument(
        "--heartbeat-interval",
        type=argtypes.positive_float,
        metavar="SECONDS",
        help="how often the worker proves itself alive (default 5)",
    )
    p.add_argument(
        "--lease-timeout",
        type=argtypes.positive_float,
        metavar="SECONDS",
        help="silence after which a worker's jobs are rescued (default 30)",
    )
    p.add_argument(
        "--rescue-interval",
        type=argtypes.positive_float,
        metavar="SECONDS",
        help="how often to look for dead workers' jobs (default 10)",
    )
    p.add_argument(
        "--atomic-concurrency",
        type=argtypes.non_negative_int,
        metavar="N",
        help="atomic jobs run at once, each holding a transaction (default 2)",
    )

    p.add_argument(
        "--horizon-warning",
        type=argtypes.duration,
        metavar="AGE",
        help="warn when a transaction holds back VACUUM for longer (default 5m)",
    )
    p.add_argument(
        "--history-retention",
        type=argtypes.duration,
        metavar="AGE",
        help="delete finished jobs older than this, in batches (e.g. 7d; default: keep)",
    )
    p.add_argument(
        "--no-periodic",
        action="store_true",
        help="do not schedule the application's recurring jobs on this worker",
    )
    p.set_defaults(handler=_worker)

    p = sub.add_parser(
        "prune",
        help="delete finished jobs older than a given age from the history, in batches",
        description="Delete finished jobs (and, without --status/--queue, periodic ticks) "
        "that finished more than --older-than ago, in batches of --batch-size, each its own "
        "short transaction. Safe to run while workers run.",
    )
    common(p)
    p.add_argument(
        "--older-than",
        type=argtypes.duration,
        required=True,
        metavar="AGE",
        help="finished at least this long ago: 7d, 12h, 1d12h, 90m or seconds",
    )
    p.add_argument(
        "--status",
        type=argtypes.final_statuses,
        metavar="STATUS",
        help="only these: succeeded, failed, cancelled (comma-separated)",
    )
    p.add_argument("--queue", type=argtypes.queue_name, help="only jobs of this queue")
    p.add_argument(
        "--batch-size",
        type=argtypes.positive_int,
        default=1000,
        metavar="N",
        help="rows deleted per transaction (default 1000)",
    )
    p.set_defaults(handler=_prune)

    p = sub.add_parser("grant", help="grant a role what a worker or an app needs, nothing more")
    common(p)
    p.add_argument("role", type=argtypes.role_name, help="an existing role")
    p.add_argument("--kind", choices=["worker", "app"], required=True)
    p.add_argument("--sql", action="store_true", help="print the GRANT statements only")
    p.set_defaults(handler=_grant)

    p = sub.add_parser("demo", help="show transactional enqueue on a small table")
    common(p)
    p.add_argument("--jobs", type=argtypes.positive_int, default=2000)
    p.add_argument("--concurrency", type=argtypes.positive_int, default=50)
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
        type=argtypes.duration,
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
    _add_jobs(sub, common)
    _tenants_parser(sub, common)
    return parser


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
        "horizon_warning": args.horizon_warning,
        "history_retention": args.history_retention,
        "periodic": False if args.no_periodic else None,
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
        console.print_status(console.make_console(), report)
    return 0


def _watchdog(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        report = health.watch(conn, args.max_age, act=args.terminate)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        console.print_watchdog(console.make_console(), report)
    return 0 if report.clear else 3


# -- jobs ------------------------------------------------------------------------------------


def _add_jobs(sub: Any, common: Any) -> None:
    jobs = sub.add_parser(
        "jobs", help="list, show, cancel or retry jobs", description="Job records and actions."
    ).add_subparsers(dest="action", required=True)

    p = jobs.add_parser("list", help="job records, newest first, live and finished")
    common(p)
    p.add_argument("--queue", type=argtypes.queue_name)
    p.add_argument("--task")
    p.add_argument("--key", "--tenant", dest="key", help="only jobs of this concurrency key")
    p.add_argument(
        "--status", type=argtypes.statuses, help="comma-separated: queued,running,failed..."
    )
    p.add_argument("--since", type=argtypes.moment, help="created since: 10m, 2h, or ISO time")
    p.add_argument("--until", type=argtypes.moment, help="created before: 10m, 2h, or ISO time")
    p.add_argument("--before-id", type=argtypes.job_id, help="the next page: ids below this")
    p.add_argument("--limit", type=argtypes.positive_int, default=50, help="1-1000 (default 50)")
    p.add_argument("--json", action="store_true", help="print the page as JSON")
    p.set_defaults(handler=_jobs_list)

    for action, help_text, handler in (
        ("show", "one job's record: status, attempts, times, errors, result", _jobs_show),
        ("cancel", "cancel a queued job now, or ask a running job's worker to stop", _jobs_cancel),
        ("retry", "enqueue a failed or cancelled job again, linked to it", _jobs_retry),
    ):
        p = jobs.add_parser(action, help=help_text)
        common(p)
        p.add_argument("id", type=argtypes.job_id, metavar="ID")
        if action == "show":
            p.add_argument("--json", action="store_true", help="print the record as JSON")
        p.set_defaults(handler=handler)


def _jobs_queue(args: argparse.Namespace) -> Queue:
    return Queue(schema=args.schema or "pgqueue")


def _jobs_list(args: argparse.Namespace) -> int:
    if args.limit > 1000:
        raise UsageError(f"--limit {args.limit} is over 1000: page with --before-id instead")
    filters = {
        "queue": args.queue,
        "task": args.task,
        "concurrency_key": args.key,
        "status": args.status,
        "created_after": args.since,
        "created_before": args.until,
        "before_id": args.before_id,
        "limit": args.limit,
    }
    with connect(resolve_dsn(args.dsn)) as conn:
        page = _jobs_queue(args).list_jobs(conn=conn, **filters)
    if args.json:
        print(page.model_dump_json(indent=2))
    else:
        console.print_jobs(console.make_console(), page)
    return 0


def _jobs_show(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        job = _jobs_queue(args).get_job(args.id, conn=conn)
    if job is None:
        raise JobNotFoundError(f"no job has id {args.id}, live or in history")
    if args.json:
        print(job.model_dump_json(indent=2))
    else:
        console.print_job(console.make_console(), job)
    return 0


def _jobs_cancel(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        done = _jobs_queue(args).cancel_job(args.id, conn=conn)
    print(
        {
            Cancellation.CANCELLED: f"job {args.id} cancelled",
            Cancellation.REQUESTED: f"job {args.id} is running: its worker was asked to stop it",
            Cancellation.FINISHED: f"job {args.id} had already finished; nothing changed",
        }[done]
    )
    return 0


def _jobs_retry(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args.dsn)) as conn:
        retry = _jobs_queue(args).retry_job(args.id, conn=conn)
    print(f"job {args.id} retried as job {retry}")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from pgqueue import retention

    cutoff = retention.Cutoff(args.older_than, args.status, args.queue, args.batch_size)
    with connect(resolve_dsn(args.dsn)) as conn:
        report = retention.prune(conn, args.schema or "pgqueue", cutoff)
    ticks = f" and {report.ticks_deleted:,} periodic ticks" if cutoff.whole_history else ""
    print(
        f"deleted {report.deleted:,} finished jobs{ticks} older than {args.older_than} "
        f"in {report.batches} batches ({report.seconds:.2f} s)",
        file=sys.stderr,
    )
    return 0


# -- tenants (per-key concurrency limits) ----------------------------------------------------


def _tenants_parser(sub: Any, common: Any) -> None:
    p = sub.add_parser("tenants", help="per-key concurrency limits (tenants)")
    verbs = p.add_subparsers(dest="verb", required=True)
    s = verbs.add_parser("set", help="set a key's (or the default) max running jobs")
    common(s)
    s.add_argument("key", nargs="?", help="the concurrency key")
    s.add_argument("--default", action="store_true", help="the limit of keys without one")
    s.add_argument("--max-running", type=argtypes.non_negative_int, required=True, metavar="N")
    s.set_defaults(handler=_tenants_set)
    r = verbs.add_parser("remove", help="remove a key's limit (it falls back to the default)")
    common(r)
    r.add_argument("key", nargs="?", help="the concurrency key")
    r.add_argument("--default", action="store_true", help="remove the default: unlimited")
    r.set_defaults(handler=_tenants_remove)
    ls = verbs.add_parser("list", help="keys with a limit, running or waiting jobs")
    common(ls)
    ls.add_argument("--json", action="store_true", help="print the keys as JSON")
    ls.set_defaults(handler=_tenants_list)


def _tenant_key(args: argparse.Namespace) -> str | None:
    if args.default == (args.key is not None):
        raise UsageError("give either a KEY or --default")
    key: str | None = args.key
    return key


def _tenants_set(args: argparse.Namespace) -> int:
    key = _tenant_key(args)
    queue = Queue(schema=args.schema or "pgqueue")
    with connect(resolve_dsn(args.dsn)) as conn, conn.transaction():
        queue.set_concurrency_limit(key, args.max_running, conn=conn)
    print(f"{key or 'default'}: at most {args.max_running} running", file=sys.stderr)
    return 0


def _tenants_remove(args: argparse.Namespace) -> int:
    key = _tenant_key(args)
    queue = Queue(schema=args.schema or "pgqueue")
    with connect(resolve_dsn(args.dsn)) as conn, conn.transaction():
        queue.set_concurrency_limit(key, None, conn=conn)
    print(f"{key or 'default'}: limit removed", file=sys.stderr)
    return 0


def _tenants_list(args: argparse.Namespace) -> int:
    import json

    queue = Queue(schema=args.schema or "pgqueue")
    with connect(resolve_dsn(args.dsn)) as conn:
        limits = queue.concurrency_limits(conn=conn)
    if args.json:
        print(json.dumps([limit.model_dump() for limit in limits], indent=2))
        return 0
    print(f"{'KEY':<32} {'MAX_RUNNING':>11} {'RUNNING':>8} {'WAITING':>8}")
    for limit in limits:
        name = "* (default)" if limit.key == "*" else limit.key
        cap = "default" if limit.max_running is None else str(limit.max_running)
        print(f"{name:<32} {cap:>11} {limit.running:>8} {limit.waiting:>8}")
    return 0
