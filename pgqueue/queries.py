"""The one loader for the SQL in sql/: named queries and numbered migrations.

Owns: reading each file once, splitting queries on their `-- name:` headers, and rendering the
schema name into them as a quoted identifier (never by string formatting). Full-line comments
are dropped from query bodies, so a comment may mention %(param)s without becoming one.
Fails with a clear error if the sql/ folder is missing from the installation.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from psycopg import sql

from pgqueue.errors import PgQueueError

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


def sql_root() -> Path:
    """The sql/ folder: inside the package when installed from a wheel, else the checkout's."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "sql", here.parent / "sql"):
        if (candidate / "queries").is_dir():
            return candidate
    raise PgQueueError(f"pgqueue's sql/ folder is missing next to {here}; reinstall pgqueue")


@functools.cache
def _raw_queries() -> dict[str, str]:
    queries: dict[str, str] = {}
    for path in sorted((sql_root() / "queries").glob("*.sql")):
        chunks = _HEADER.split(path.read_text())
        for name, body in zip(chunks[1::2], chunks[2::2], strict=False):
            if name in queries:
                raise PgQueueError(f"query {name!r} is defined twice (second in {path.name})")
            lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
            queries[name] = "\n".join(lines).strip()
    return queries


# The tables a query may name by placeholder ({jobs}, ...) rather than as {schema}.jobs, so
# that a Citus worker can run it on a node against one shard's own tables; and {in_shard},
# its rows of one shard value, which on such a table are every row (IN_ALL_ROWS).
Tables = tuple[tuple[str, str], ...]
_TABLES = ("jobs", "job_history", "queue_pauses")
IN_ALL_ROWS: Tables = (("in_shard", ""),)


@functools.cache
def query(name: str, schema: str, tables: Tables = ()) -> sql.Composed:
    """The named query with its schema rendered as an identifier. Cached per (name, schema).
    `tables` renames placeholder tables: (("jobs", "jobs_102008"),) names that table."""
    try:
        text = _raw_queries()[name]
    except KeyError:
        raise PgQueueError(f"no query named {name!r} in sql/queries") from None
    return _render(text, schema, tables)


@functools.cache
def statement(name: str, schema: str, tables: Tables = ()) -> bytes | sql.Composed:
    """The named query rendered once to bytes, for statements run once per job: psycopg
    renders a Composed again at every execute, a visible share of an enqueue's client time.
    Its lines lose their indentation: psycopg parses and hashes a statement longer than its
    cache's limit (4 KiB) again at every execute, which job_finish_many was, indented. No
    query has a string literal across lines, which this would change (test_queries.py).
    ASCII is the same bytes in every client encoding; a schema name outside it keeps the
    Composed."""
    composed = query(name, schema, tables)
    text = "\n".join(line.lstrip() for line in composed.as_string(None).splitlines())
    return text.encode("ascii") if text.isascii() else composed


def grant(name: str, schema: str, role: str) -> sql.Composed:
    """A grant_* statement for `role` on `schema`, both rendered as identifiers."""
    try:
        text = _raw_queries()[name]
    except KeyError:
        raise PgQueueError(f"no query named {name!r} in sql/queries") from None
    return sql.SQL(text).format(schema=sql.Identifier(schema), role=sql.Identifier(role))


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel that wakes the workers of `schema`."""
    return f"{schema}_jobs"


def outbox_channel(schema: str) -> str:
    """The channel that tells relays a staging transaction committed (payload: its lowest
    message id)."""
    return f"{schema}_outbox"


def done_channel(schema: str) -> str:
    """The channel that tells waiters a job they wait for finished (payload: its id;
    pgqueue/queue/waiting.py parses it)."""
    return f"{schema}_done"


def dead_channel(schema: str) -> str:
    """The channel that hears about jobs the rescuer abandoned (payload: JSON id/task/queue)."""
    return f"{schema}_dead"


def _render(text: str, schema: str, tables: Tables = ()) -> sql.Composed:
    named: dict[str, sql.Composable] = {table: sql.Identifier(schema, table) for table in _TABLES}
    named["in_shard"] = sql.SQL("shard = %(shard)s")
    for placeholder, table in tables:
        if placeholder == "in_shard":
            named[placeholder] = sql.SQL("true")
        elif placeholder in _TABLES:
            named[placeholder] = sql.Identifier(schema, table)
        else:
            raise PgQueueError(f"no table placeholder {{{placeholder}}} in sql/queries")
    return sql.SQL(text).format(
        **named,
        schema=sql.Identifier(schema),
        schema_name=sql.Literal(schema),
        channel=sql.Identifier(channel(schema)),
        wake_channel=sql.Literal(channel(schema)),
        outbox_channel=sql.Literal(outbox_channel(schema)),
        done=sql.Identifier(done_channel(schema)),
        done_channel=sql.Literal(done_channel(schema)),
    )


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    def render(self, schema: str) -> sql.Composed:
        return _render(self.text, schema)


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """All migrations in version order; versions must be 1, 2, 3, ... without gaps."""
    found = []
    for path in sorted((sql_root() / "migrations").glob("*.sql")):
        match = _MIGRATION_FILE.match(path.name)
        if match is None:
            raise PgQueueError(f"migration file {path.name!r} is not named NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise PgQueueError(f"migration {expected:04d} is missing (found {migration.version})")
    return tuple(found)
