"""`pgqueue enqueue` and `pgqueue signal`: what the command sends into the queue, through
the same calls an application makes (Queue.enqueue, Queue.signal), so a job or a signal sent
from a shell passes the same checks as one sent from Python.

A bad argument or option is a UsageError (exit 2) and nothing is stored; each send commits
on its own. With --wait, a job that fails, is cancelled or outlives the timeout is exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

from pgqueue.cli.commands import require_migrated
from pgqueue.cli.target import UsageError, connect, resolve_dsn, schema_of, warn_unknown
from pgqueue.errors import TaskError
from pgqueue.models import NewJob
from pgqueue.queue import AsyncQueue, Queue
from pgqueue.registry import EnqueueOptions

FOREVER = timedelta.max  # --wait without a timeout

# The command's options that are queue.enqueue's options of the same name.
_OPTIONS = (
    "queue",
    "priority",
    "run_at",
    "delay",
    "max_attempts",
    "dedupe_key",
    "dedupe_window",
    "concurrency_key",
    "fairness_key",
    "tags",
)


def enqueue(args: argparse.Namespace) -> int:
    app: Queue | AsyncQueue | None = args.app_loaded
    warn_unknown(args, queues=[args.queue])
    dsn = resolve_dsn(args)
    queue = _queue(args, dsn)
    try:
        job = _job(queue, app, args)
        with connect(dsn) as conn:
            require_migrated(conn, queue.schema)
            job_id = queue.enqueue(job, conn=conn)
        print(job_id, flush=True)
        if not job_id.created:
            print(
                f"pgqueue: job {job_id} with dedupe key {args.dedupe_key!r} already exists; "
                "nothing enqueued",
                file=sys.stderr,
            )
        if args.wait is not None:
            timeout = None if args.wait == FOREVER else args.wait
            print(json.dumps(queue.wait(job_id, timeout=timeout)))
    finally:
        queue.close()
    return 0


def signal(args: argparse.Namespace) -> int:
    dsn = resolve_dsn(args)
    queue = _queue(args, dsn)
    try:
        with connect(dsn) as conn:
            require_migrated(conn, queue.schema)
            try:
                sent = queue.signal(args.key, args.payload, conn=conn)
            except TaskError as exc:  # a payload that cannot be stored: the command line's
                raise UsageError(str(exc)) from None
    finally:
        queue.close()
    print(sent)
    return 0


def _queue(args: argparse.Namespace, dsn: str) -> Queue:
    """A Queue on the command's database and schema, with the app's payload limit."""
    app: Queue | AsyncQueue | None = args.app_loaded
    schema = schema_of(args)
    if app is None:
        return Queue(dsn, schema=schema)
    return Queue(dsn, schema=schema, max_payload_bytes=app.settings.max_payload_bytes)


def _job(queue: Queue, app: Queue | AsyncQueue | None, args: argparse.Namespace) -> NewJob:
    """The job, validated as task.with_options(...).job(...) validates it in Python: against
    the app's task, or a task declared by name when there is no app."""
    given: dict[str, Any] = {
        name: getattr(args, name) for name in _OPTIONS if getattr(args, name) is not None
    }
    options: EnqueueOptions = given  # type: ignore[assignment]
    positional: list[Any] = args.args if isinstance(args.args, list) else []
    keywords: dict[str, Any] = dict(args.args) if isinstance(args.args, dict) else {}
    for name, value in (args.kwargs or {}).items():
        if name in keywords:
            raise UsageError(f"argument {name!r} is given by --args and by --kwargs; give it once")
        keywords[name] = value
    if positional and app is None:
        raise UsageError(
            f"--args {json.dumps(positional)} gives arguments by position, which only the "
            "task's signature can name: pass --app MODULE:ATTR, or give them by name, "
            "--args '{\"x\": 1}'"
        )
    try:
        task = app.registry.get(args.task) if app is not None else queue.declare(args.task)
        return task.with_options(**options).job(*positional, **keywords)
    except TaskError as exc:
        raise UsageError(str(exc)) from None
