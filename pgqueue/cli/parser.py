"""The `pgqueue` command line: every subcommand, option, help text and default."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from pgqueue._version import __version__
from pgqueue.cli import argtypes, commands, send
from pgqueue.models import WorkerSettings

DESCRIPTION = """\
pgqueue: a job queue that lives in your PostgreSQL database.

Run `pgqueue migrate` once, then `pgqueue worker myapp.jobs:queue` to run the jobs your
application enqueues. Every command takes --app MODULE:ATTR (or PGQUEUE_APP), your Queue, and
then works on its database and schema and checks task and queue names against it. The
database: --dsn, else PGQUEUE_DSN, else DATABASE_URL, else the DSN of the app's Queue. Only
when nothing names one does a command start a throwaway embedded PostgreSQL in ./.pgqueue/
(with pgqueue-py[embedded] installed), and say so.
"""

LOG_LEVELS = ("debug", "info", "warning", "error")

DSN_HELP = (
    "PostgreSQL DSN (default: PGQUEUE_DSN, else DATABASE_URL, else the DSN of the app's "
    "Queue, else a throwaway embedded PostgreSQL)"
)
APP_HELP = (
    "your Queue or AsyncQueue, as for the worker: its DSN, schema and task names serve "
    "every command; --dsn and --schema still win (default: PGQUEUE_APP)"
)

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


class _Help(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and shows each option's default after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "(default:" in text
            or not action.option_strings
            or default in (None, False, argparse.SUPPRESS)
        ):
            return text
        return f"{text} (default: %(default)s)"


def build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgqueue", description=DESCRIPTION, formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"pgqueue {__version__}")
    _globals(parser, default=True)
    parser.set_defaults(dsn=None, schema=None, app=None, parser=parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(
            name, help=help_text, formatter_class=_Help, **kwargs
        )
        p.set_defaults(parser=p)
        _globals(p, default=False)
        return p

    _migrate(add("migrate", "create or upgrade the pgqueue tables"))
    _worker(add("worker", "run the jobs of the tasks registered on MODULE:ATTR"))
    _dashboard(add("dashboard", "serve the web dashboard (needs pgqueue-py[dashboard])"))
    _workers(add("workers", "list the live workers: host, pid, queues, running jobs"))
    _relay(add("relay", "publish the messages staged in the outbox (MODULE:ATTR, a Relay)"))
    _outbox(add("outbox", "staged messages and dead letters; retry dead ones"))
    _status(add("status", "queue counts and what holds back VACUUM"))
    _recurring(add("recurring", "recurring jobs: schedule, next and last run, active or paused"))
    _enqueue(add("enqueue", "enqueue a job of a task; --wait prints its result"))
    _signal(add("signal", "send a signal to the job waiting for its key (durable tasks)"))
    _jobs(add("jobs", "list, show, cancel or retry jobs", description="Job records and actions."))
    _tenants(add("tenants", "per-key concurrency limits (tenants)"))
    _queues(add("queues", "pause, resume and list queues"))
    _rates(add("rates", "rate limits of queues, tasks and concurrency keys"))
    _prune(add("prune", "delete finished jobs older than a given age, in batches"))
    _watchdog(
        add(
            "watchdog",
            "report (and optionally end) transactions holding the xmin horizon too long",
            description=WATCHDOG_HELP,
        )
    )
    _grant(add("grant", "grant a role what a worker or an app needs, nothing more"))
    _demo(add("demo", "show transactional enqueue on a small table"))
    return parser


def _globals(p: argparse.ArgumentParser, *, default: bool) -> None:
    """Options taken before or after the subcommand. A subcommand's own copies default to
    SUPPRESS, so they never overwrite a value given before it."""
    unset = argparse.SUPPRESS
    p.add_argument(
        "--log-level",
        default="info" if default else unset,
        choices=LOG_LEVELS,
        help="how much to log on stderr" + (" (default: info)" if not default else ""),
    )
    p.add_argument("--dsn", default=unset, help=DSN_HELP)
    p.add_argument("--app", default=unset, metavar="MODULE:ATTR", help=APP_HELP)
    p.add_argument(
        "--schema",
        type=argtypes.schema,
        default=unset,
        help="schema of the pgqueue tables (default: pgqueue)",
    )


def _migrate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sql", action="store_true", help="print the pending SQL, apply nothing")
    p.add_argument(
        "--citus",
        action="store_true",
        help="on a Citus coordinator: then lay the tables out for the cluster (jobs distributed "
        "by their shard key)",
    )
    p.set_defaults(handler=commands.migrate)


def _relay(p: argparse.ArgumentParser) -> None:
    p.add_argument("relay", metavar="MODULE:ATTR", help="your pgqueue.relay.Relay")
    p.add_argument("--batch-size", type=argtypes.positive_int, help="messages read at once")
    p.add_argument("--publishers", type=argtypes.positive_int, help="lanes publishing at once")
    p.set_defaults(handler=commands.relay)


def _outbox(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dead", action="store_true", help="list the dead letters, newest first")
    p.add_argument(
        "--retry",
        nargs="*",
        type=argtypes.positive_int,
        metavar="ID",
        help="stage dead messages again: those named, or all of them",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=commands.outbox)


def _seconds(name: str) -> float:
    value = WorkerSettings.model_fields[name].default
    assert isinstance(value, timedelta)
    return value.total_seconds()


def _worker(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "target",
        nargs="?",
        metavar="MODULE:ATTR",
        help="your pgqueue Queue or AsyncQueue (default: --app, else PGQUEUE_APP)",
    )
    processes_option(p)
    worker_options(p)
    p.add_argument(
        "--citus-claims",
        choices=("nodes", "coordinator"),
        default="nodes",
        help="a Citus worker's claims and outcomes: on each shard's node (default), or through"
        " the coordinator, for nodes this host cannot reach by the names the cluster knows",
    )
    p.set_defaults(handler=commands.worker)


def processes_option(p: argparse.ArgumentParser) -> None:
    """--processes, for `pgqueue worker` and a framework's worker command alike."""
    p.add_argument(
        "--processes",
        type=argtypes.processes,
        default=1,
        metavar="N",
        help="worker processes on this host, each with these options, started, restarted and"
        " stopped by one supervisor that serves their --metrics-port; auto: one per core"
        " (default: 1, no supervisor)",
    )


def worker_options(p: argparse.ArgumentParser) -> None:
    """The worker's own options: `pgqueue worker`'s, and those of a framework's command
    that knows the app and the database itself (`manage.py pgqueue_worker`)."""
    d = WorkerSettings.model_fields
    p.add_argument(
        "--queues",
        type=argtypes.queues,
        default=("default",),
        metavar="NAMES",
        help="comma-separated queues to serve, or `all` for every queue your tasks name "
        "(default: default)",
    )
    for flag, kind, name, help_text in (
        ("--concurrency", argtypes.positive_int, "concurrency", "jobs run at once"),
        (
            "--batch-size",
            argtypes.positive_int,
            "batch_size",
            "jobs claimed per statement, at most",
        ),
        (
            "--atomic-concurrency",
            argtypes.non_negative_int,
            "atomic_concurrency",
            "atomic jobs run at once, each holding a transaction",
        ),
    ):
        p.add_argument(flag, type=kind, default=d[name].default, metavar="N", help=help_text)
    p.add_argument("--burst", action="store_true", help="exit once the queues are empty")
    p.add_argument(
        "--poll-only",
        action="store_true",
        help="no prepared statements or session settings, and no LISTEN unless --listen-dsn"
        " (PgBouncer transaction mode)",
    )
    p.add_argument(
        "--listen-dsn",
        metavar="DSN",
        help="LISTEN for wake-ups on this database connection instead of --dsn: a direct one"
        " to PostgreSQL while --dsn goes through PgBouncer with --poll-only"
        " (default: PGQUEUE_LISTEN_DSN)",
    )
    for flag, name, help_text in (
        ("--poll-interval", "poll_interval", "how often to look for jobs without a wake-up"),
        (
            "--claim-cooldown",
            "claim_cooldown",
            "while jobs keep arriving, claim at most this often, so they share a claim"
            " (0: claim on every wake-up)",
        ),
        ("--shutdown-grace", "shutdown_grace", "how long running jobs get to finish on stop"),
        ("--heartbeat-interval", "heartbeat_interval", "how often the worker proves it is alive"),
        ("--lease-timeout", "lease_timeout", "silence after which a worker's jobs are rescued"),
        ("--rescue-interval", "rescue_interval", "how often to look for dead workers' jobs"),
    ):
        p.add_argument(
            flag,
            type=argtypes.non_negative_float,
            default=_seconds(name),
            metavar="SECONDS",
            help=help_text,
        )
    p.add_argument(
        "--horizon-warning",
        type=argtypes.duration,
        default="5m",
        metavar="AGE",
        help="warn when a transaction holds back VACUUM for longer",
    )
    p.add_argument(
        "--history-retention",
        type=argtypes.duration,
        metavar="AGE",
        help="delete finished jobs older than this, in batches, e.g. 7d (default: keep them)",
    )
    p.add_argument(
        "--no-periodic",
        action="store_true",
        help="do not schedule the application's recurring jobs on this worker",
    )
    p.add_argument(
        "--metrics-port",
        type=argtypes.port,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs pgqueue-py[metrics])",
    )
    p.add_argument(
        "--metrics-host", default="0.0.0.0", metavar="HOST", help="where --metrics-port listens"
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="an OpenTelemetry span per job, linked to its enqueue's (needs pgqueue-py[otel])",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON line per job outcome and per log record, for a log pipeline",
    )


def _dashboard(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Serve the dashboard: queues, jobs, workers, tenants, recurring jobs and the "
        "database's health, with /metrics for Prometheus. Read-only unless --allow-actions, "
        "which needs a token (PGQUEUE_DASHBOARD_TOKEN) or basic auth "
        "(PGQUEUE_DASHBOARD_BASIC_AUTH=user:password)."
    )
    p.add_argument(
        "target",
        nargs="?",
        metavar="MODULE:ATTR",
        help="your Queue, for its DSN and schema (default: --app, else PGQUEUE_APP)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=argtypes.port, default=8080, help="the port to listen on")
    p.add_argument(
        "--allow-actions",
        action="store_true",
        help="allow retry, cancel, pause and tenant limits (needs a token or basic auth)",
    )
    p.add_argument(
        "--actions-dsn",
        metavar="DSN",
        help="run actions as another role (one granted --kind operator); default: --dsn",
    )
    p.add_argument(
        "--horizon-warning",
        type=argtypes.duration,
        default="5m",
        metavar="AGE",
        help="the health page warns of a transaction holding the horizon for longer",
    )
    p.set_defaults(handler=commands.dashboard)


def _workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the workers as JSON")
    p.set_defaults(handler=commands.workers)


def _status(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Per-queue counts, the oldest sessions, replication slots and prepared transactions "
        "holding back the xmin horizon, and the jobs table's dead rows."
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=commands.status)


def _recurring(p: argparse.ArgumentParser) -> None:
    p.description = (
        "The recurring jobs the workers have stored, and with --app (or PGQUEUE_APP) those "
        "your app defines: each one's task, schedule, next run, last run (the latest tick "
        "that became a job) and state: active, paused (its queue is paused; needs the app), "
        "idle (no worker has scheduled it for a few minutes), not in app, new (no worker has "
        "run it yet) or invalid."
    )
    p.add_argument("--json", action="store_true", help="print the recurring jobs as JSON")
    p.set_defaults(handler=commands.recurring)


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help_text: str
) -> argparse.ArgumentParser:
    """One action of a command with actions (`jobs list`, `tenants set`): its own usage on an
    error, and the global options after it too."""
    q: argparse.ArgumentParser = actions.add_parser(name, help=help_text, formatter_class=_Help)
    q.set_defaults(parser=q)
    _globals(q, default=False)
    return q


def _jobs(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return _action(actions, name, help_text)

    q = add("list", "job records, newest first, live and finished")
    q.add_argument("--queue", type=argtypes.queue_name, help="only jobs of this queue")
    q.add_argument("--task", help="only jobs of this task")
    q.add_argument("--key", "--tenant", dest="key", help="only jobs of this concurrency key")
    q.add_argument("--tag", help="only jobs with this tag")
    q.add_argument("--workflow", type=argtypes.job_id, help="only jobs of this workflow")
    q.add_argument(
        "--status", type=argtypes.statuses, help="comma-separated: queued,running,failed..."
    )
    q.add_argument("--since", type=argtypes.moment, help="created since: 10m, 2h, or ISO time")
    q.add_argument("--until", type=argtypes.moment, help="created before: 10m, 2h, or ISO time")
    q.add_argument("--before-id", type=argtypes.job_id, help="the next page: ids below this")
    q.add_argument(
        "--limit", type=argtypes.positive_int, default=50, help="jobs per page, 1 to 1000"
    )
    q.add_argument("--json", action="store_true", help="print the page as JSON")
    q.set_defaults(handler=commands.jobs_list)
    for action, help_text, handler in (
        ("show", "one job's record: status, attempts, times, errors, result", commands.jobs_show),
        ("workflow", "a workflow's jobs: each one's status and what it waits for", None),
        ("cancel", "cancel a queued job now, or ask a running job's worker to stop", None),
        ("retry", "enqueue a failed or cancelled job again, linked to it", None),
    ):
        q = add(action, help_text)
        q.add_argument("id", type=argtypes.job_id, metavar="ID", help="the job's id")
        if action in ("show", "workflow"):
            q.add_argument("--json", action="store_true", help="print the record as JSON")
        q.set_defaults(handler=handler or getattr(commands, f"jobs_{action}"))


ENQUEUE_HELP = """\
Enqueue one job of TASK and print its id, as queue.enqueue does: the same checks of the
options and the arguments, in one committed transaction.

With --app (or PGQUEUE_APP), TASK must be one of the app's tasks: the arguments are
validated against its handler's signature (missing, unknown or mistyped ones are refused,
nothing enqueued), and the task's own options (queue, priority, max attempts, atomic...)
apply unless given here. Without an app, TASK is enqueued as queue.declare(TASK) would:
its name, the options and that the arguments are JSON by name are checked, but not whether
any worker knows the task nor its signature (a worker fails such a job when it runs it),
and the job takes pgqueue's default options, not the task's: enqueue an atomic task with
--app, since its flag travels with the job.

exit status:
  0  enqueued (and with --wait, it succeeded: its result is printed as JSON)
  1  database error; with --wait, the job failed, was cancelled or ran past the timeout
  2  bad command line: bad JSON, arguments or options, or a task the app does not have
"""


def _enqueue(p: argparse.ArgumentParser) -> None:
    p.description = ENQUEUE_HELP
    p.add_argument("task", metavar="TASK", help="the task's name")
    p.add_argument(
        "--args",
        type=argtypes.json_arguments,
        metavar="JSON",
        help="the arguments: a JSON array by position, [2, 3] (needs --app), or an object by "
        'name, {"x": 2}',
    )
    p.add_argument(
        "--kwargs",
        type=argtypes.json_object,
        metavar="JSON",
        help='more arguments by name, a JSON object: {"y": 3}',
    )
    p.add_argument("--queue", type=argtypes.queue_name, help="the queue (default: the task's)")
    p.add_argument("--priority", type=int, metavar="N", help="-100 to 100; lower runs first")
    p.add_argument(
        "--run-at", type=argtypes.iso_time, metavar="TIME", help="not before this ISO 8601 time"
    )
    p.add_argument(
        "--delay", type=argtypes.duration, metavar="AGE", help="not before this long from now"
    )
    p.add_argument(
        "--max-attempts", type=argtypes.positive_int, metavar="N", help="attempts, at most"
    )
    p.add_argument("--dedupe-key", metavar="KEY", help="no second live job with this key")
    p.add_argument(
        "--dedupe-window",
        type=argtypes.duration,
        metavar="AGE",
        help="with --dedupe-key: also none that finished this recently",
    )
    p.add_argument("--concurrency-key", metavar="KEY", help="the tenant whose limit applies")
    p.add_argument("--fairness-key", metavar="KEY", help="the key whose fair share applies")
    p.add_argument(
        "--tag", dest="tags", action="append", metavar="TAG", help="a tag; repeat for more"
    )
    p.add_argument(
        "--wait",
        nargs="?",
        type=argtypes.duration,
        const=send.FOREVER,
        metavar="SECONDS",
        help="wait for the job and print its result as JSON, on the line after its id; a "
        "timeout such as 30 or 5m, else as long as it takes",
    )
    p.set_defaults(handler=send.enqueue)


def _signal(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Send a signal for KEY, as queue.signal does: the job that has waited longest for the "
        "key (ctx.wait_for_signal) wakes and gets the payload; a signal nobody waits for yet "
        "is kept for the next job that does. Prints the signal's id. Signals go to a key, not "
        "to a job: `pgqueue jobs show ID` says which key a parked job waits for."
    )
    p.add_argument("key", metavar="KEY", help="the key the job waits for")
    p.add_argument(
        "--payload",
        type=argtypes.json_value,
        metavar="JSON",
        help="what the job gets, as JSON (default: null)",
    )
    p.set_defaults(handler=send.signal)


def _tenants(p: argparse.ArgumentParser) -> None:
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return _action(verbs, name, help_text)

    s = add("set", "set a key's (or the default) max running jobs")
    s.add_argument("key", nargs="?", help="the concurrency key")
    s.add_argument("--default", action="store_true", help="the limit of keys without one")
    s.add_argument(
        "--max-running",
        type=argtypes.non_negative_int,
        required=True,
        metavar="N",
        help="jobs of the key running at once, at most (0 pauses the key)",
    )
    s.set_defaults(handler=commands.tenants_set)
    r = add("remove", "remove a key's limit (it falls back to the default)")
    r.add_argument("key", nargs="?", help="the concurrency key")
    r.add_argument("--default", action="store_true", help="remove the default: unlimited")
    r.set_defaults(handler=commands.tenants_set)
    ls = add("list", "keys with a limit, running or waiting jobs")
    ls.add_argument("--json", action="store_true", help="print the keys as JSON")
    ls.set_defaults(handler=commands.tenants_list)
    w = add("weight", "set a fairness key's weight (its share against other keys)")
    w.add_argument("key", help="the fairness key")
    w.add_argument("weight", type=float, nargs="?", help="above 0; 2 gets twice a key at 1")
    w.add_argument("--remove", action="store_true", help="back to the default weight, 1")
    w.set_defaults(handler=commands.tenants_weight)
    sh = add("shares", "each fairness key's share of its queue's starts against its share owed")
    sh.add_argument(
        "--window", type=float, default=300.0, metavar="SECONDS", help="the window (300)"
    )
    sh.add_argument("--json", action="store_true", help="print the shares as JSON")
    sh.set_defaults(handler=commands.tenants_shares)


def _queues(p: argparse.ArgumentParser) -> None:
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    pause = _action(verbs, "pause", "stop claiming a queue's jobs; running ones finish")
    pause.add_argument("names", nargs="+", type=argtypes.queue_name, metavar="QUEUE")
    pause.add_argument("--reason", default="", help="why, shown by `queues list`")
    pause.set_defaults(handler=commands.queues_pause)
    resume = _action(verbs, "resume", "claim a paused queue's jobs again")
    resume.add_argument("names", nargs="+", type=argtypes.queue_name, metavar="QUEUE")
    resume.set_defaults(handler=commands.queues_resume)
    limit = _action(verbs, "limit", "let at most N of a queue's jobs start per period")
    limit.add_argument("name", type=argtypes.queue_name, metavar="QUEUE")
    limit.add_argument("rate", metavar="RATE", help="N/s, N/m or N/h, e.g. 600/m")
    limit.set_defaults(handler=commands.queues_limit)
    unlimit = _action(verbs, "unlimit", "remove a queue's rate limit")
    unlimit.add_argument("name", type=argtypes.queue_name, metavar="QUEUE")
    unlimit.set_defaults(handler=commands.queues_unlimit)
    ls = _action(verbs, "list", "each queue's jobs, whether it is paused, and its rate limit")
    ls.add_argument("--json", action="store_true", help="print the queues as JSON")
    ls.set_defaults(handler=commands.queues_list)


def _rates(p: argparse.ArgumentParser) -> None:
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def scope(q: argparse.ArgumentParser) -> None:
        which = q.add_mutually_exclusive_group(required=True)
        which.add_argument("--queue", type=argtypes.queue_name, help="a queue's jobs")
        which.add_argument("--task", help="a task's jobs, in whatever queue")
        which.add_argument("--key", help="a concurrency key's jobs, in whatever queue")
        which.add_argument(
            "--default-key", action="store_true", help="each key without a limit of its own"
        )

    s = _action(verbs, "set", "let at most N jobs start per period, across all workers")
    scope(s)
    s.add_argument("rate", metavar="RATE", help="N/s, N/m or N/h, e.g. 600/m")
    s.set_defaults(handler=commands.rates_set)
    r = _action(verbs, "remove", "remove a rate limit")
    scope(r)
    r.set_defaults(handler=commands.rates_set, rate=None)
    ls = _action(verbs, "list", "every rate limit, with the starts in its current window")
    ls.add_argument("--json", action="store_true", help="print the limits as JSON")
    ls.set_defaults(handler=commands.rates_list)


def _prune(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Delete finished jobs (and, without --status/--queue, periodic ticks) that finished "
        "more than --older-than ago, in batches of --batch-size, each its own short "
        "transaction. Safe to run while workers run. Deleting everything (--older-than under "
        "a minute) asks for confirmation, or --yes."
    )
    _age(p, "--older-than", "finished at least this long ago: 7d, 12h, 1d12h, 90m or seconds")
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
        help="rows deleted per transaction",
    )
    p.add_argument("--yes", action="store_true", help="do not ask before deleting everything")
    p.set_defaults(handler=commands.prune)


def _age(p: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A required age option: a duration such as 90s, 10m, 1h30m or 7d."""
    p.add_argument(flag, type=argtypes.duration, required=True, metavar="AGE", help=help_text)


def _watchdog(p: argparse.ArgumentParser) -> None:
    _age(p, "--max-age", "report holders at least this old: 90s, 10m, 1h, 1h30m or seconds")
    p.add_argument(
        "--terminate",
        action="store_true",
        help="pg_terminate_backend the reported sessions (default: dry run)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=commands.watchdog)


def _grant(p: argparse.ArgumentParser) -> None:
    p.add_argument("role", type=argtypes.role_name, help="an existing role")
    p.add_argument(
        "--kind",
        choices=["worker", "app", "read", "operator"],
        required=True,
        help="what the role will run: a worker, an enqueueing app, a read-only dashboard or "
        "scrape, or the dashboard's actions",
    )
    p.add_argument("--sql", action="store_true", help="print the GRANT statements only")
    p.set_defaults(handler=commands.grant)


def _demo(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Enqueue orders with their jobs in committed and rolled-back transactions, run them "
        "with a real worker, and check that exactly the committed ones ran, once. It works "
        "in a schema of its own, pgqueue_demo unless --schema (never the app's), dropped "
        "and recreated on each run and left afterwards to look at; it first says which "
        "database (--dsn, PGQUEUE_DSN, DATABASE_URL, else the embedded one) and schema it "
        "writes to, and ends saying how to drop the schema. It refuses a schema that holds "
        "other tables than a demo's."
    )
    p.add_argument(
        "--jobs", type=argtypes.positive_int, default=2000, help="jobs the demo enqueues"
    )
    p.add_argument(
        "--concurrency", type=argtypes.positive_int, default=50, help="the demo worker's"
    )
    p.set_defaults(handler=commands.demo)
