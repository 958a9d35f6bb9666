"""Which database a Queue, an AsyncQueue or a `pgqueue` command uses: the one rule.

The first of: the DSN given (in code, or `--dsn` on the command line), PGQUEUE_DSN,
DATABASE_URL. An empty variable counts as unset. Nothing here connects or checks the DSN's
form; a malformed one fails, naming itself, when first used. `redact` masks a DSN's password
wherever one is shown.
"""

from __future__ import annotations

import os

import psycopg

ENV_VARS = ("PGQUEUE_DSN", "DATABASE_URL")


def resolve(given: str | None = None) -> str | None:
    """`given`, else PGQUEUE_DSN, else DATABASE_URL; None when none of them names a database."""
    if given:
        return given
    for name in ENV_VARS:
        value = os.environ.get(name)
        if value:
            return value
    return None


def missing(kind: str) -> str:
    """What to say when a `kind` ("Queue", "AsyncQueue") with no DSN needs a database."""
    return (
        f"this {kind} has no dsn: pass conn= to use your connection, create it with "
        f"{kind}(dsn=...), or set PGQUEUE_DSN or DATABASE_URL before creating it"
    )


def redact(dsn: str) -> str:
    """The DSN with any password masked, for error messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an invalid DSN"
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **info)
