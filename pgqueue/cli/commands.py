"""What each `pgqueue` subcommand does, given its parsed arguments. Returns the exit code."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import psycopg
from pydantic import BaseModel

from pgqueue import health, words
from pgqueue import migrate as migrations
from pgqueue.cli.target import (
    UsageError,
    checked_listen_dsn,
    connect,
    dsn_source,
    load_object,
    resolve_dsn,
    schema_of,
    warn_unknown,
)
from pgqueue.errors import DatabaseError, JobNotFoundError
from pgqueue.models import ALL_QUEUES, Cancellation, DeadMessage, WorkerSettings
from pgqueue.queries import migrations as all_migrations
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.store import migrations as migration_store
from pgqueue.store.workers import WorkerRow, WorkersStore

DEMO_SCHEMA = "pgqueue_demo"
CONFIRM_BELOW_SECONDS = 60  # a prune this close to now deletes the whole history
log = logging.getLogger("pgqueue.cli")


def _console() -> ModuleType:
    """The terminal output module, which needs rich: installed with pgqueue-py[cli]."""
    try:
        from pgqueue.cli import console
    except ImportError as exc:
        raise UsageError(
            f"this output needs the `rich` package ({exc}): pip install 'pgqueue-py[cli]', "
            "or pass --json"
        ) from None
    return console


def _print(report: object, printer: str) -> None:
    """Print `report` for a terminal with the console's `printer`."""
    console = _console()
    getattr(console, printer)(console.make_console(), report)


def _show(args: argparse.Namespace, report: BaseModel, printer: str) -> None:
    """Print `report` as JSON with --json, else for a terminal with the console's `printer`."""
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        _print(report, printer)


# -- commands --------------------------------------------------------------------------------


def migrate(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    with connect(resolve_dsn(args)) as conn:
        if args.sql:
            print(migrations.render(schema, migrations.pending(conn, schema)), end="")
            if args.citus:
                print(_citus_layout_sql(conn, schema), end="")
            return 0
        applied = _citus_migrate(conn, schema) if args.citus else migrations.apply(conn, schema)
        app: Queue | AsyncQueue | None = args.app_loaded
        synced = None if app is None else _sync_tasks(conn, schema, app)
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in applied) or "none (up to date)"
    print(f"schema {schema}: applied {names}", file=sys.stderr)
    if synced is not None:
        written = ", ".join(synced) or "none (up to date)"
        print(f"schema {schema}: task declarations written {written}", file=sys.stderr)
    return 0


def _citus_migrate(conn: psycopg.Connection[Any], schema: str) -> list[Any]:
    from pgqueue import citus

    return citus.migrate(conn, schema)


def _citus_layout_sql(conn: psycopg.Connection[Any], schema: str) -> str:
    from pgqueue.citus.layout import is_laid_out
    from pgqueue.store.citus import layout_sql

    if is_laid_out(conn, schema):
        return ""
    return f"-- the Citus layout\n{layout_sql(schema)}\n"


def _sync_tasks(conn: psycopg.Connection[Any], schema: str, app: Queue | AsyncQueue) -> list[str]:
    """The app's task declarations, written where enqueue() in SQL reads them."""
    from pgqueue.store import tasks as tasks_store
    from pgqueue.store.plan import run

    try:
        return run(conn, tasks_store.sync_plan(schema, app.registry.declarations()))
    except psycopg.Error as exc:
        raise DatabaseError(f"task declarations not written to schema {schema}: {exc}") from None


def worker(args: argparse.Namespace) -> int:
    from pgqueue.cli import supervised
    from pgqueue.worker.worker import Worker

    app: Queue | AsyncQueue | None = args.app_loaded
    if app is None:
        raise UsageError(
            "which app's tasks should the worker run? pgqueue worker MODULE:ATTR "
            "(or --app MODULE:ATTR, or PGQUEUE_APP=MODULE:ATTR)"
        )
    child = supervised.from_environ()
    if args.queues != (ALL_QUEUES,) and child is None:  # the supervisor warned already
        warn_unknown(args, queues=args.queues)
    processes = _processes(args)
    options: dict[str, Any] = {
        "queues": args.queues,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "burst": args.burst,
        "poll_only": args.poll_only,
        "poll_interval": args.poll_interval,
        "claim_cooldown": args.claim_cooldown,
        "shutdown_grace": args.shutdown_grace,
        "heartbeat_interval": args.heartbeat_interval,
        "lease_timeout": args.lease_timeout,
        "rescue_interval": args.rescue_interval,
        "atomic_concurrency": args.atomic_concurrency,
        "horizon_warning": args.horizon_warning,
        "history_retention": args.history_retention,
        "periodic": not args.no_periodic,
    }
    settings = WorkerSettings(**options)
    dsn = resolve_dsn(args)
    if _is_citus(app) and processes == 1:
        return _citus_worker(args, app, dsn, settings, child)
    listen_dsn = checked_listen_dsn(args.listen_dsn or os.environ.get("PGQUEUE_LISTEN_DSN"))
    run = Worker(
        app,
        dsn=dsn,
        settings=settings,
        schema=args.schema,
        observers=_observers(args),
        listen_dsn=listen_dsn,
    )
    with connect(dsn) as conn:
        require_migrated(conn, run.schema)
    if processes > 1:
        return _supervise(args, processes, dsn, run.schema)
    if child is not None:
        supervised.tag_logs(child)
        supervised.watch_supervisor(child, run.stop)
    if args.metrics_port is not None:
        metrics = _extra("pgqueue.metrics", "metrics", "--metrics-port")
        _serve_metrics(args, metrics.registry_for_worker(run, dsn, database=child is None))
    run.run()
    if run.abandoned_threads:
        # Sync handlers cannot be interrupted; their jobs were put back (the stop went as
        # designed, hence 0). Waiting for their threads could take forever: leave now.
        logging.shutdown()
        os._exit(0)
    return 0


def _is_citus(app: object) -> bool:
    from pgqueue.citus import CitusQueue

    return isinstance(app, CitusQueue)


def _citus_worker(
    args: argparse.Namespace, app: Any, dsn: str, settings: WorkerSettings, child: Any
) -> int:
    """A CitusQueue's worker: claims shard by shard on the cluster (pgqueue/citus/)."""
    from pgqueue.citus import CitusWorker

    if args.metrics_port is not None:
        raise UsageError("--metrics-port is not available for a Citus worker")
    run = CitusWorker(
        app, dsn=dsn, settings=settings, schema=schema_of(args), claim_on=args.citus_claims
    )
    if child is not None:
        from pgqueue.cli import supervised

        supervised.tag_logs(child)
        supervised.watch_supervisor(child, run.stop)
    run.run()
    return 0


def _processes(args: argparse.Namespace) -> int:
    """How many worker processes --processes asks for, `auto` resolved to the cores."""
    from pgqueue.cli.supervisor import cores

    wanted: int | str = getattr(args, "processes", 1)  # framework commands have no option
    if wanted != "auto":
        return int(wanted)
    found = cores()
    log.info("--processes auto: %s", words.plural(found, "worker process", "worker processes"))
    return found


def _supervise(args: argparse.Namespace, processes: int, dsn: str, schema: str) -> int:
    """Run `processes` workers under one supervisor, their metrics summed on one port."""
    from pgqueue.cli.supervisor import Supervisor

    collector = None
    if args.metrics_port is not None:
        metrics = _extra("pgqueue.metrics", "metrics", "--metrics-port")
        from pgqueue.cli.merged_metrics import ChildrenCollector

        collector = ChildrenCollector()
        registry = metrics.CollectorRegistry()
        registry.register(collector)
        registry.register(metrics.DatabaseCollector(dsn, schema))
        _serve_metrics(args, registry)
    # Each child runs the supervisor's own command (`pgqueue worker`, or a framework's)
    # with --processes 1 appended: the last one given wins.
    command = getattr(args, "child_command", None) or [sys.executable, "-m", "pgqueue", *args.argv]
    return Supervisor(command, processes, burst=args.burst, dsn=dsn, metrics=collector).run()


def _serve_metrics(args: argparse.Namespace, registry: Any) -> None:
    try:
        _extra("pgqueue.metrics", "metrics", "--metrics-port").serve(
            registry, args.metrics_port, args.metrics_host
        )
    except OSError as exc:
        raise UsageError(
            f"--metrics-port {args.metrics_port}: cannot listen on "
            f"{args.metrics_host}:{args.metrics_port} ({exc.strerror or exc})"
        ) from None
    log.info("metrics at http://%s:%s/metrics", args.metrics_host, args.metrics_port)


def require_migrated(conn: psycopg.Connection[Any], schema: str) -> None:
    """Refuse, before a worker starts, a schema that lacks this version's tables."""
    pending = migration_store.pending(conn, schema)
    if not pending:
        return
    option = "" if schema == "pgqueue" else f" --schema {schema}"
    if len(pending) == len(all_migrations()):
        raise DatabaseError(
            f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate{option}` first"
        )
    names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
    raise DatabaseError(
        f"schema {schema!r} lacks migrations {names} of this pgqueue version: run "
        f"`pgqueue migrate{option}` first"
    )


def _observers(args: argparse.Namespace) -> list[Any]:
    """What the worker's options ask it to tell of each job."""
    from pgqueue.worker.observe import JsonFormatter, JsonLog

    observers: list[Any] = []
    if args.log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
        observers.append(JsonLog())
    if args.trace:
        observers.append(_extra("pgqueue.tracing", "otel", "--trace").JobTracer())
    return observers


def _extra(module: str, extra: str, option: str) -> ModuleType:
    """`module`, or a clear error naming the extra that `option` needs."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(
            f"{option} needs pgqueue-py[{extra}]: pip install 'pgqueue-py[{extra}]' ({exc})"
        ) from None


def dashboard(args: argparse.Namespace) -> int:
    token = os.environ.get("PGQUEUE_DASHBOARD_TOKEN") or None
    basic_text = os.environ.get("PGQUEUE_DASHBOARD_BASIC_AUTH") or None
    basic: tuple[str, str] | None = None
    if basic_text is not None:
        user, sep, password = basic_text.partition(":")
        if not sep or not user or not password:
            raise UsageError("PGQUEUE_DASHBOARD_BASIC_AUTH is user:password")
        basic = (user, password)
    web = _extra("pgqueue.dashboard", "dashboard", "pgqueue dashboard")
    uvicorn = _extra("uvicorn", "dashboard", "pgqueue dashboard")
    schema = schema_of(args)
    site = web.create_app(
        resolve_dsn(args),
        schema=schema,
        allow_actions=args.allow_actions,
        token=token,
        basic_auth=basic,
        actions_dsn=args.actions_dsn,
        horizon_warning=args.horizon_warning,
    )
    log.info("dashboard of schema %s at http://%s:%s/", schema, args.host, args.port)
    try:
        uvicorn.run(site, host=args.host, port=args.port, log_level=args.log_level.lower())
    finally:
        site.state.dashboard.close()
    return 0


def relay(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from pgqueue.relay.publisher import Relay

    found = load_object(args.relay)
    if not isinstance(found, Relay):
        raise UsageError(f"{args.relay} is a {type(found).__name__}, not a pgqueue.relay.Relay")
    if args.schema:
        found.schema = args.schema
    if args.batch_size:
        found.batch_size = args.batch_size
    if args.publishers:
        found.publishers = args.publishers
    dsn = resolve_dsn(args, found.dsn)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, found.stop)
        await found.run(dsn)

    asyncio.run(run())
    return 0


def outbox(args: argparse.Namespace) -> int:
    from pgqueue.store import outbox as outbox_store
    from pgqueue.store.plan import run

    schema = schema_of(args)
    with connect(resolve_dsn(args)) as conn:
        if args.retry is not None:
            count = run(conn, outbox_store.retry_plan(schema, args.retry or None))
            print(f"staged {words.plural(count, 'dead message')} again", file=sys.stderr)
            return 0
        if args.dead:
            dead = run(conn, outbox_store.dead_plan(schema, 100), together=False)
            if args.json:
                print(json.dumps([d.model_dump(mode="json") for d in dead], indent=2))
            else:
                _print_dead(dead)
            return 0
        stats = run(conn, outbox_store.stats_plan(schema), together=False)
    if args.json:
        print(json.dumps(stats.model_dump(mode="json"), indent=2))
    else:
        oldest = stats.oldest_staged_at.isoformat() if stats.oldest_staged_at else "-"
        print(f"staged {stats.staged}, oldest staged at {oldest}, dead {stats.dead}")
    return 0


def _print_dead(dead: Sequence[DeadMessage]) -> None:
    """Dead letters as columns under a header, newest first; the error last, in full."""
    if not dead:
        print("no dead messages")
        return
    print(f"{'ID':>8}  {'DESTINATION':<24} {'KEY':<16} {'TRIES':>5}  ERROR")
    for d in dead:
        key, error = d.key or "-", d.error or "-"
        print(f"{d.id:>8}  {d.destination:<24} {key:<16} {d.attempts:>5}  {error}")


def workers(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        rows = WorkersStore(schema_of(args)).list(conn)
    if args.json:
        print(json.dumps([_worker_json(row) for row in rows], indent=2))
    else:
        _print(rows, "print_workers")
    return 0


def _worker_json(row: WorkerRow) -> dict[str, Any]:
    data: dict[str, Any] = dict(vars(row))
    data["started_at"] = row.started_at.isoformat()
    data["heartbeat_at"] = row.heartbeat_at.isoformat()
    data["silent_for"] = row.silent_for.total_seconds()
    return data


def grant(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    if args.sql:
        print(migrations.grant_sql(schema, args.role, args.kind).as_string(None))
        return 0
    with connect(resolve_dsn(args)) as conn:
        migrations.grant_role(conn, schema, args.role, args.kind)
    print(f"granted {args.kind} privileges on schema {schema} to {args.role}", file=sys.stderr)
    return 0


def demo(args: argparse.Namespace) -> int:
    try:
        from pgqueue.cli import demo as show
    except ImportError as exc:
        raise UsageError(f"the demo needs `rich` ({exc}): pip install 'pgqueue-py[cli]'") from None
    return show.run(
        resolve_dsn(args),
        jobs=args.jobs,
        concurrency=args.concurrency,
        schema=args.schema or DEMO_SCHEMA,  # never the app's: the demo recreates its schema
        source=dsn_source(args),
    )


def status(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        report = health.status(conn, schema_of(args))
    _show(args, report, "print_status")
    return 0


def recurring(args: argparse.Namespace) -> int:
    from pgqueue.cli import recurring as listing
    from pgqueue.store.periodic import list_periodic

    with connect(resolve_dsn(args)) as conn:
        stored = list_periodic(conn, schema_of(args))
        paused = {p.queue for p in _jobs_queue(args).paused_queues(conn=conn)}
    found = listing.listing(stored, args.app_loaded, paused)
    if args.json:
        print(json.dumps([r.as_json() for r in found], indent=2))
    else:
        _print(found, "print_recurring")
    return 0


def watchdog(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        report = health.watch(conn, args.max_age, act=args.terminate)
    _show(args, report, "print_watchdog")
    return 0 if report.clear else 3


def prune(args: argparse.Namespace) -> int:
    from pgqueue.history import retention

    if args.older_than.total_seconds() < CONFIRM_BELOW_SECONDS and not args.yes:
        _confirm(
            f"delete every job that finished more than {words.duration(args.older_than)} ago, "
            "nearly all"
        )
    warn_unknown(args, queues=[args.queue])
    cutoff = retention.Cutoff(args.older_than, args.status, args.queue, args.batch_size)
    with connect(resolve_dsn(args)) as conn:
        report = retention.prune(conn, schema_of(args), cutoff)
    if report.partitions:
        days = ", ".join(name for name, _ in report.partitions)
        rows = sum(estimate for _, estimate in report.partitions)
        dropped = words.plural(len(report.partitions), "day")
        about = words.plural(rows, "job")
        print(f"dropped {dropped} of history ({days}, about {about})", file=sys.stderr)
    deleted = words.plural(report.deleted, "finished job")
    ticks = ""
    if cutoff.whole_history:
        ticks = " and " + words.plural(report.ticks_deleted, "periodic tick")
    print(
        f"deleted {deleted}{ticks} older than {words.duration(args.older_than)}, "
        f"in {words.plural(report.batches, 'batch', 'batches')} ({report.seconds:.2f} s)",
        file=sys.stderr,
    )
    return 0


def _confirm(what: str) -> None:
    """Ask on a terminal; refuse without one, so a script never deletes by accident."""
    if not sys.stdin.isatty():
        raise UsageError(f"this would {what} of the history: pass --yes to confirm")
    answer = input(f"pgqueue: {what} of the history? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("nothing deleted")


# -- jobs ------------------------------------------------------------------------------------


def _jobs_queue(args: argparse.Namespace) -> Queue:
    return Queue(schema=schema_of(args))


def jobs_list(args: argparse.Namespace) -> int:
    if args.limit > 1000:
        raise UsageError(f"--limit {args.limit} is over 1000: page with --before-id instead")
    filters = {
        "queue": args.queue,
        "task": args.task,
        "concurrency_key": args.key,
        "tag": args.tag,
        "workflow": args.workflow,
        "status": args.status,
        "created_after": args.since,
        "created_before": args.until,
        "before_id": args.before_id,
        "limit": args.limit,
    }
    warn_unknown(args, tasks=[args.task], queues=[args.queue])
    with connect(resolve_dsn(args)) as conn:
        page = _jobs_queue(args).list_jobs(conn=conn, **filters)
    _show(args, page, "print_jobs")
    return 0


def jobs_show(args: argparse.Namespace) -> int:
    """A job's record, and for a durable job its steps and what it waits for (with --json,
    under "steps", whole; absent for a job that made no durable call)."""
    with connect(resolve_dsn(args)) as conn:
        queue = _jobs_queue(args)
        job = queue.get_job(args.id, conn=conn)
        steps = queue.job_steps(args.id, conn=conn) if job is not None else None
    if job is None or steps is None:
        raise JobNotFoundError(f"no job has id {args.id}, live or in history")
    durable = bool(steps.steps) or steps.waiting is not None
    if args.json:
        shown = job.model_dump(mode="json")
        if durable:
            shown["steps"] = steps.model_dump(mode="json", exclude={"job_id"})
        print(json.dumps(shown, indent=2))
    else:
        _print((job, steps if durable else None), "print_job")
    return 0


def jobs_workflow(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        flow = _jobs_queue(args).get_workflow(args.id, conn=conn)
    if flow is None:
        raise JobNotFoundError(
            f"no workflow has id {args.id} (a workflow's id is its first job's id)"
        )
    _show(args, flow, "print_workflow")
    return 0


def jobs_cancel(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        done = _jobs_queue(args).cancel_job(args.id, conn=conn)
    print(
        {
            Cancellation.CANCELLED: f"job {args.id} cancelled",
            Cancellation.REQUESTED: f"job {args.id} is running: its worker was asked to stop it",
            Cancellation.FINISHED: f"job {args.id} had already finished; nothing changed",
        }[done]
    )
    return 0


def jobs_retry(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        retry = _jobs_queue(args).retry_job(args.id, conn=conn)
    print(f"job {args.id} retried as job {retry}")
    return 0


# -- tenants (per-key concurrency limits) ----------------------------------------------------


def _tenant_key(args: argparse.Namespace) -> str | None:
    if args.default == (args.key is not None):
        raise UsageError("give either a KEY or --default")
    key: str | None = args.key
    return key


def tenants_set(args: argparse.Namespace) -> int:
    """`tenants set` (a limit) and `tenants remove` (no max_running: the limit goes)."""
    key = _tenant_key(args)
    limit = getattr(args, "max_running", None)
    with connect(resolve_dsn(args)) as conn, conn.transaction():
        _jobs_queue(args).set_concurrency_limit(key, limit, conn=conn)
    done = "limit removed" if limit is None else f"at most {limit} running"
    print(f"{key or 'default'}: {done}", file=sys.stderr)
    return 0


def queues_pause(args: argparse.Namespace) -> int:
    warn_unknown(args, queues=args.names)
    with connect(resolve_dsn(args)) as conn:
        newly = _jobs_queue(args).pause_queue(args.names, reason=args.reason, conn=conn)
    for name in args.names:
        done = "paused" if name in newly else "was paused already"
        print(f"{name}: {done}; running jobs finish, queued ones wait", file=sys.stderr)
    return 0


def queues_resume(args: argparse.Namespace) -> int:
    warn_unknown(args, queues=args.names)
    with connect(resolve_dsn(args)) as conn:
        resumed = _jobs_queue(args).resume_queue(args.names, conn=conn)
    for name in args.names:
        print(f"{name}: {'resumed' if name in resumed else 'was not paused'}", file=sys.stderr)
    return 0


def queues_limit(args: argparse.Namespace) -> int:
    warn_unknown(args, queues=[args.name])
    with connect(resolve_dsn(args)) as conn:
        _jobs_queue(args).set_rate_limit(args.name, args.rate, conn=conn)
    print(f"{args.name}: at most {args.rate} starts, across all workers", file=sys.stderr)
    return 0


def queues_unlimit(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        queue = _jobs_queue(args)
        had = any(r.queue == args.name for r in queue.rate_limits(conn=conn))
        queue.set_rate_limit(args.name, None, conn=conn)
    print(f"{args.name}: {'no rate limit now' if had else 'had no rate limit'}", file=sys.stderr)
    return 0


def queues_list(args: argparse.Namespace) -> int:
    """Every queue with jobs, a pause or a rate limit: its counts (as `status` shows them),
    its pause and its limit."""
    with connect(resolve_dsn(args)) as conn:
        stats = {q.queue: q for q in health.queue_stats(conn, schema_of(args))}
        paused = {p.queue: p for p in _jobs_queue(args).paused_queues(conn=conn)}
        rates = {r.queue: r for r in _jobs_queue(args).rate_limits(conn=conn) if r.queue}
    rows = []
    for name in sorted(stats.keys() | paused.keys() | rates.keys()):
        q, pause, rate = stats.get(name), paused.get(name), rates.get(name)
        rows.append(
            {
                "queue": name,
                "paused": pause is not None,
                "paused_at": None if pause is None else pause.paused_at.isoformat(),
                "reason": "" if pause is None else pause.reason,
                "queued": q.queued if q else 0,
                "scheduled": q.scheduled if q else 0,
                "running": q.running if q else 0,
                "waiting": q.waiting if q else 0,
                "blocked": q.blocked if q else 0,
                "rate_limit": None
                if rate is None
                else rate.model_dump(exclude={"queue", "task", "key"}),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'QUEUE':<24} {'STATE':<8} {'QUEUED':>8} {'SCHEDULED':>9} {'RUNNING':>8}"
        f" {'RATE':>12}  REASON"
    )
    for row in rows:
        state = "paused" if row["paused"] else "active"
        rate = rates.get(str(row["queue"]))
        shown = "-" if rate is None else f"{rate.max_starts}/{rate.period:g}s"
        print(
            f"{row['queue']:<24} {state:<8} {row['queued']:>8} {row['scheduled']:>9} "
            f"{row['running']:>8} {shown:>12}  {row['reason']}"
        )
    return 0


def rates_set(args: argparse.Namespace) -> int:
    """`rates set` (a limit) and `rates remove` (no rate: the limit goes)."""
    warn_unknown(args, tasks=[args.task], queues=[args.queue])
    queue = _jobs_queue(args)
    with connect(resolve_dsn(args)) as conn:
        if args.queue:
            queue.set_rate_limit(args.queue, args.rate, conn=conn)
            what = f"queue {args.queue}"
        elif args.task:
            queue.set_task_rate_limit(args.task, args.rate, conn=conn)
            what = f"task {args.task}"
        else:
            key = None if args.default_key else args.key
            queue.set_key_rate_limit(key, args.rate, conn=conn)
            what = "each key without its own limit" if key is None else f"key {key}"
    done = "no rate limit now" if args.rate is None else f"at most {args.rate} starts"
    print(f"{what}: {done}, across all workers", file=sys.stderr)
    return 0


def rates_list(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        limits = _jobs_queue(args).rate_limits(conn=conn)
    if args.json:
        print(json.dumps([limit.model_dump() for limit in limits], indent=2))
        return 0
    print(f"{'LIMIT':<40} {'RATE':>12} {'IN WINDOW':>10} {'ROOM IN':>8}")
    for limit in limits:
        if limit.queue is not None:
            name = f"queue {limit.queue}"
        elif limit.task is not None:
            name = f"task {limit.task}"
        else:
            name = "key * (default)" if limit.key == "*" else f"key {limit.key}"
        rate = f"{limit.max_starts}/{limit.period:g}s"
        print(f"{name:<40} {rate:>12} {limit.recent_starts:>10} {limit.room_in:>7.1f}s")
    return 0


def tenants_weight(args: argparse.Namespace) -> int:
    """`tenants weight KEY WEIGHT`, or `--remove` to go back to 1."""
    if args.remove == (args.weight is not None):
        raise UsageError("give either a WEIGHT or --remove")
    with connect(resolve_dsn(args)) as conn, conn.transaction():
        _jobs_queue(args).set_fairness_weight(args.key, args.weight, conn=conn)
    done = "weight 1 (default)" if args.weight is None else f"weight {args.weight:g}"
    print(f"{args.key}: {done}, for jobs enqueued from now on", file=sys.stderr)
    return 0


def tenants_shares(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        shares = _jobs_queue(args).fair_shares(window=args.window, conn=conn)
    if args.json:
        print(json.dumps([share.model_dump() for share in shares], indent=2))
        return 0
    print(
        f"{'QUEUE':<20} {'KEY':<28} {'WEIGHT':>7} {'QUEUED':>8} {'RUNNING':>8} "
        f"{'STARTED':>8} {'SHARE':>7} {'OWED':>7}"
    )
    for s in shares:
        got = "-" if s.share is None else f"{100 * s.share:.1f}%"
        print(
            f"{s.queue:<20} {s.key:<28} {s.weight:>7g} {s.queued:>8} {s.running:>8} "
            f"{s.started:>8} {got:>7} {100 * s.owed:>6.1f}%"
        )
    return 0


def tenants_list(args: argparse.Namespace) -> int:
    with connect(resolve_dsn(args)) as conn:
        limits = _jobs_queue(args).concurrency_limits(conn=conn)
    if args.json:
        print(json.dumps([limit.model_dump() for limit in limits], indent=2))
        return 0
    print(f"{'KEY':<32} {'MAX_RUNNING':>11} {'RUNNING':>8} {'WAITING':>8}")
    for limit in limits:
        name = "* (default)" if limit.key == "*" else limit.key
        cap = "default" if limit.max_running is None else str(limit.max_running)
        print(f"{name:<32} {cap:>11} {limit.running:>8} {limit.waiting:>8}")
    return 0
