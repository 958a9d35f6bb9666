"""What one phase of the lifecycle bench cost the server, counted rather than timed.

Owns: a snapshot of the server's counters before a phase and their difference after it, in
the bench's own database. Counted: transactions (pg_stat_database); heap rows inserted,
updated (HOT or not) and deleted per table (pg_stat_user_tables); WAL records, full-page
images and bytes (pg_stat_wal, and the WAL position); the WAL records themselves by kind and
by relation (pg_walinspect, where it can be created), which is where index entries inserted
per index are read: PostgreSQL counts no index inserts, but every B-tree insertion writes one
WAL record; and each statement's calls, rows, blocks dirtied, WAL and execution time
(pg_stat_statements, where the server preloads it). A source that is missing is named in
`missing`, and its figures are left out, never guessed.

Counters are flushed by each backend when it ends, so `after` waits until every other session
of the database has gone before it reads them.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

# B-tree WAL records that add a leaf entry: a plain insert, an insert into a posting list
# (deduplicated keys), and a page split, which carries the entry that caused it.
INDEX_INSERTS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")
_BLOCK = re.compile(r"rel (\d+)/(\d+)/(\d+)")
# The bench's own reads of the counters, left out of the statements it reports.
_OWN = r"pg_stat_|pg_get_wal|pg_current_wal|pg_wal_lsn_diff|pg_relation_filenode|^CHECKPOINT|^SHOW"


@dataclass
class Sources:
    """Which counters this server offers, found once per database."""

    statements: bool
    walinspect: bool
    checkpoint: bool
    missing: list[str] = field(default_factory=list)


def sources(conn: psycopg.Connection[Any]) -> Sources:
    found = Sources(statements=False, walinspect=False, checkpoint=False)
    preload = str(conn.execute("SHOW shared_preload_libraries").fetchone() or [""])
    if "pg_stat_statements" in preload:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        found.statements = True
    else:
        found.missing.append(
            "pg_stat_statements (not in shared_preload_libraries): no per-statement figures"
        )
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        found.walinspect = True
    except psycopg.Error as exc:
        found.missing.append(f"pg_walinspect ({exc.diag.message_primary}): no WAL by relation")
    try:
        conn.execute("CHECKPOINT")
        found.checkpoint = True
    except psycopg.Error as exc:
        found.missing.append(f"CHECKPOINT ({exc.diag.message_primary}): FPIs depend on history")
    return found


@dataclass
class Snapshot:
    lsn: str
    xacts: int
    wal: dict[str, int]
    tables: dict[str, dict[str, int]]


def before(conn: psycopg.Connection[Any], schema: str, found: Sources) -> Snapshot:
    """A CHECKPOINT (so the phase's full-page images are its own first touches, not the
    previous phase's), then the counters; pg_stat_statements is emptied."""
    settle(conn)
    if found.checkpoint:
        conn.execute("CHECKPOINT")
    if found.statements:
        conn.execute("SELECT pg_stat_statements_reset()")
    return _read(conn, schema)


def after(
    conn: psycopg.Connection[Any], schema: str, start: Snapshot, found: Sources
) -> dict[str, Any]:
    """What the phase since `start` cost, once its sessions have gone."""
    settle(conn)
    end = _read(conn, schema)
    cost: dict[str, Any] = {
        "transactions": end.xacts - start.xacts,
        "wal": {k: end.wal[k] - start.wal.get(k, 0) for k in end.wal},
        "tables": _table_changes(start.tables, end.tables),
    }
    row = conn.execute("SELECT pg_wal_lsn_diff(%s, %s)::bigint", [end.lsn, start.lsn]).fetchone()
    cost["wal"]["lsn_bytes"] = int(row[0]) if row else 0
    if found.walinspect:
        cost["wal_records"] = _wal_records(conn, start.lsn, end.lsn)
    if found.statements:
        cost["statements"] = _statements(conn)
    return cost


def settle(conn: psycopg.Connection[Any], timeout: float = 60.0) -> None:
    """Wait until this is the database's only session: the others' counters are flushed."""
    deadline = time.monotonic() + timeout
    while True:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
        if not row or row[0] == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("other sessions stayed in the bench database")
        time.sleep(0.05)
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")


def _read(conn: psycopg.Connection[Any], schema: str) -> Snapshot:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    lsn = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    xacts = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database"
        " WHERE datname = current_database()"
    ).fetchone()
    wal = conn.execute("SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal").fetchone()
    rows = conn.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
        " FROM pg_stat_user_tables WHERE schemaname = %s",
        [schema],
    ).fetchall()
    return Snapshot(
        lsn=str(lsn[0]) if lsn else "0/0",
        xacts=int(xacts[0]) if xacts else 0,
        wal=dict(zip(("records", "fpi", "bytes"), map(int, wal), strict=True)) if wal else {},
        tables={
            str(r[0]): {"inserted": r[1], "updated": r[2], "hot_updated": r[3], "deleted": r[4]}
            for r in rows
        },
    )


def _table_changes(
    start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    changed = {}
    for name, now in end.items():
        was = start.get(name, {})
        delta = {k: v - was.get(k, 0) for k, v in now.items()}
        if any(delta.values()):
            changed[name] = delta
    return changed


def _wal_records(conn: psycopg.Connection[Any], start: str, end: str) -> dict[str, Any]:
    """The phase's WAL records by relation and kind; index inserts per B-tree index."""
    names = _relations(conn)
    records = conn.execute(
        "SELECT resource_manager, record_type, record_length, fpi_length, block_ref"
        " FROM pg_get_wal_records_info(%s, %s)",
        [start, end],
    ).fetchall()
    kinds: Counter[str] = Counter()
    by_relation: dict[str, Counter[str]] = {}
    index_inserts: Counter[str] = Counter()
    fpi: Counter[str] = Counter()
    for rmgr, kind, length, fpi_length, block_ref in records:
        where = _relation(str(block_ref or ""), names)
        kinds[f"{rmgr}/{kind}"] += 1
        by_relation.setdefault(where, Counter())["records"] += 1
        by_relation[where]["bytes"] += int(length)
        if fpi_length:
            fpi[where] += 1
        if rmgr == "Btree" and str(kind).split()[0] in INDEX_INSERTS:
            index_inserts[where] += 1
    return {
        "count": len(records),
        "by_kind": dict(kinds.most_common()),
        "by_relation": {k: dict(v) for k, v in sorted(by_relation.items())},
        "fpi_by_relation": dict(fpi.most_common()),
        "index_inserts": dict(index_inserts.most_common()),
    }


def _relations(conn: psycopg.Connection[Any]) -> dict[tuple[int, int], str]:
    rows = conn.execute(
        "SELECT d.oid, pg_relation_filenode(c.oid), c.relname"
        " FROM pg_class AS c, pg_database AS d"
        " WHERE d.datname = current_database() AND pg_relation_filenode(c.oid) IS NOT NULL"
    ).fetchall()
    return {(int(db), int(node)): str(name) for db, node, name in rows}


def _relation(block_ref: str, names: dict[tuple[int, int], str]) -> str:
    """The relation a record's first block belongs to; records of no block, by themselves."""
    match = _BLOCK.search(block_ref)
    if match is None:
        return "(no relation: commits, checkpoints, ...)"
    key = (int(match[2]), int(match[3]))
    return names.get(key, "(other database)" if key[0] not in {k[0] for k in names} else "(gone)")


def _statements(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT query, sum(calls)::bigint, sum(rows)::bigint, sum(shared_blks_hit)::bigint,"
        " sum(shared_blks_dirtied)::bigint, sum(wal_records)::bigint, sum(wal_fpi)::bigint,"
        " sum(wal_bytes)::bigint, sum(total_exec_time)::float8"
        " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
        " WHERE datname = current_database()) AND NOT query ~ %s"
        " GROUP BY query ORDER BY 2 DESC",
        [_OWN],
    ).fetchall()
    keys = ("query", "calls", "rows", "blocks_hit", "blocks_dirtied", "wal_records", "wal_fpi")
    return [dict(zip((*keys, "wal_bytes", "exec_ms"), row, strict=True)) for row in rows]
