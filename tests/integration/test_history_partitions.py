"""The history partitioned by day (sql/migrations/0016_history_partitions.sql,
pgqueue/history/partitions.py): retention drops whole days, with no DELETE; an installation upgraded
with history in place moves to partitions in short steps and keeps every row; a row whose day
has no partition is never refused."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue
from pgqueue.history.partitions import HistoryPartitions
from pgqueue.history.retention import Cutoff, prune
from pgqueue.migrate import AHEAD_DAYS, apply, grant_role
from pgqueue.queries import migrations, query
from pgqueue.testing import drain

# Run on each server CI tests against: partitions are the server's DDL.
pytestmark = pytest.mark.each_server


def _today() -> datetime:
    return datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)


def _partitions(conn: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    """Each partition of job_history with its bound, written in UTC."""
    conn.execute("SET TimeZone = 'UTC'")
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i"
        " JOIN pg_class AS c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        [f'"{schema}".job_history'],
    ).fetchall()
    return {name: bound for name, bound in rows}


def _where(conn: psycopg.Connection[Any], schema: str) -> dict[int, str]:
    """Each history row's id and the partition that holds it."""
    rows = conn.execute(
        sql.SQL("SELECT id, tableoid::regclass::text FROM {}.job_history").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    return {row[0]: row[1].split(".")[-1] for row in rows}


def _upkeep(dsn: str, schema: str) -> list[str]:
    return asyncio.run(HistoryPartitions(dsn, schema).upkeep())


def _finish(queue: Queue, n: int) -> list[int]:
    """Run `n` jobs to success; their ids."""

    @queue.task(name="t")
    def t(i: int) -> None:
        return None

    ids = [int(i) for i in queue.enqueue_many([t.job(i) for i in range(n)])]
    drain(queue)
    return ids


def test_a_new_schema_gets_a_partition_a_day_and_finished_jobs_land_in_today_s(
    dsn: str,
) -> None:
    schema = f"pgq_new_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn) as conn:
        apply(conn, schema)  # in a caller's transaction: migrations only, as Django runs it
        assert set(_partitions(conn, schema)) == {"job_history_legacy"}
        conn.commit()
    queue = Queue(dsn, schema=schema)
    try:
        _new_schema_keeps_history_by_day(queue, dsn, schema)
    finally:
        queue.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _new_schema_keeps_history_by_day(queue: Queue, dsn: str, schema: str) -> None:
    steps = _upkeep(dsn, schema)
    today = _today()
    days = [(today + timedelta(days=d)).strftime("%Y%m%d") for d in range(AHEAD_DAYS)]
    assert steps == ["the empty history table is the default partition"] + [
        f"made partition job_history_{d}" for d in days
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        parts = _partitions(conn, schema)
        assert parts[f"job_history_{days[0]}"] == (
            f"FOR VALUES FROM ('{today:%Y-%m-%d} 00:00:00+00') "
            f"TO ('{today + timedelta(days=1):%Y-%m-%d} 00:00:00+00')"
        )
        assert parts["job_history_default"] == "DEFAULT"
        ids = _finish(queue, 3)
        where = _where(conn, schema)
    assert {where[i] for i in ids} == {f"job_history_{days[0]}"}
    assert _upkeep(dsn, schema) == []  # nothing left to do
    for job_id in ids:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "succeeded"


def test_migrate_keeps_history_by_day_from_the_start(queue: Queue, dsn: str, schema: str) -> None:
    # queue.migrate() on its own autocommit connection ran the upkeep after the migrations.
    with psycopg.connect(dsn, autocommit=True) as conn:
        parts = _partitions(conn, schema)
    assert parts.pop("job_history_default") == "DEFAULT"
    assert sorted(parts) == [
        f"job_history_{_today() + timedelta(days=d):%Y%m%d}" for d in range(AHEAD_DAYS)
    ]
    assert _upkeep(dsn, schema) == []


def test_retention_drops_whole_days_and_deletes_nothing(
    queue: Queue, dsn: str, schema: str
) -> None:
    ids = _finish(queue, 20)
    with psycopg.connect(dsn, autocommit=True) as conn:
        today_part = _where(conn, schema)[ids[0]]
        # Three days on, a retention of one day: today's partition lies wholly before it.
        report = prune(conn, schema, Cutoff(timedelta(days=1)), now=_today() + timedelta(days=3))
        parts = _partitions(conn, schema)
        left = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.job_history").format(sql.Identifier(schema))
        ).fetchone()
        deleted = conn.execute(
            "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname LIKE 'job_history%%'",
            [schema],
        ).fetchone()
    assert today_part in [name for name, _ in report.partitions]
    assert today_part not in parts
    assert left == (0,) and report.deleted == 0
    assert deleted == (0,)  # no row was deleted: the day went with its table
    assert queue.get_job(ids[0]) is None


def test_a_row_whose_day_has_no_partition_lands_in_the_default(
    queue: Queue, dsn: str, schema: str
) -> None:
    far = _today() + timedelta(days=40)
    ids = _finish(queue, 2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.job_history SET finished_at = %s WHERE id = %s").format(
                sql.Identifier(schema)
            ),
            [far, ids[0]],
        )
        assert _where(conn, schema)[ids[0]] == "job_history_default"
    # Pruned in batches like any row outside a whole dropped day.
    with psycopg.connect(dsn, autocommit=True) as conn:
        report = prune(conn, schema, Cutoff(timedelta(days=1)), now=far + timedelta(days=3))
    assert report.deleted == 1 and queue.get_job(ids[0]) is None


def _old_history(conn: psycopg.Connection[Any], schema: str, n: int) -> list[int]:
    """`n` finished jobs written straight into history, as an older version left them (its
    workers would not start on a schema that is not migrated to this version)."""
    rows = conn.execute(
        sql.SQL(
            "INSERT INTO {}.job_history (id, queue, task, args, status, priority, attempt,"
            " max_attempts, run_at, created_at, started_at, finished_at)"
            " SELECT 1000000 + g, 'default', 't', jsonb_build_object('i', g), 'succeeded',"
            " 0, 1, 25,"
            " now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',"
            " now() - interval '1 hour' + g * interval '1 s'"
            " FROM generate_series(1, %s) AS g RETURNING id"
        ).format(sql.Identifier(schema)),
        [n],
    ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture
def old_schema(dsn: str) -> Iterator[str]:
    """A schema migrated only to the version before partitioning, as an installation that
    upgrades finds it."""
    name = f"pgq_old_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute(query("migration_table_create", name))
        for migration in migrations():
            if migration.name == "history_partitions":
                break
            conn.execute(migration.render(name))
            conn.execute(
                query("migration_record", name),
                {"version": migration.version, "name": migration.name},
            )
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def test_an_upgrade_keeps_every_row_and_moves_the_old_table_aside_in_short_steps(
    dsn: str, old_schema: str
) -> None:
    schema = old_schema
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:  # history in the old, plain table
        old = _old_history(conn, schema, 50)
    role = f"pgq_w_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        # A worker's role from before the upgrade: it could register workers.
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {0} TO {1}; GRANT INSERT ON {0}.workers TO {1}").format(
                sql.Identifier(schema), sql.Identifier(role)
            )
        )
    with psycopg.connect(dsn) as conn:  # migrations only: the worker role keeps partitions
        applied = [m.name for m in apply(conn, schema)]
        assert applied[0] == "history_partitions"  # and those made since
        assert set(_partitions(conn, schema)) == {"job_history_legacy"}
        conn.commit()
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn) | {"user": role}
        steps = _upkeep(psycopg.conninfo.make_conninfo("", **info), schema)  # the worker role
        sealed = _today() + timedelta(days=2)
        assert steps[:3] == [
            f"sealed the existing history below {sealed:%Y-%m-%d} 00:00:00+00",
            "checked the existing history",
            f"the existing history is the partition below {sealed:%Y-%m-%d} 00:00:00+00",
        ]
        with psycopg.connect(dsn, autocommit=True) as conn:
            parts = _partitions(conn, schema)
            assert parts["job_history_legacy"] == (
                f"FOR VALUES FROM (MINVALUE) TO ('{sealed:%Y-%m-%d} 00:00:00+00')"
            )
            assert parts["job_history_default"] == "DEFAULT"
            assert f"job_history_{sealed:%Y%m%d}" in parts  # daily ones from there on
            new = _finish(queue, 5)
            where = _where(conn, schema)
        assert {where[i] for i in old + new} == {"job_history_legacy"}  # today is below it
        for job_id in old:
            job = queue.get_job(job_id)
            assert job is not None and job.status == "succeeded"
        assert len(queue.list_jobs(status="succeeded", limit=100).jobs) == 55
        # Once the cutoff passes its range, the old table goes as a whole too.
        with psycopg.connect(dsn, autocommit=True) as conn:
            report = prune(conn, schema, Cutoff(timedelta(days=1)), now=sealed + timedelta(days=1))
            assert "job_history_legacy" in [name for name, _ in report.partitions]
            assert report.deleted == 0
    finally:
        queue.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_only_the_worker_role_may_drop_history_partitions(dsn: str, schema: str) -> None:
    app = f"pgq_a_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(app)))
        grant_role(conn, schema, app, "app")
    info = psycopg.conninfo.conninfo_to_dict(dsn) | {"user": app}
    try:
        with (
            psycopg.connect(psycopg.conninfo.make_conninfo("", **info)) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(
                sql.SQL("SELECT * FROM {}.history_partitions_drop('infinity', 100)").format(
                    sql.Identifier(schema)
                )
            )
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(app)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(app)))


def test_get_job_and_list_jobs_look_up_every_partition_by_index(
    queue: Queue, dsn: str, schema: str
) -> None:
    import json

    from pgqueue.models import JobFilter

    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(40):  # a month of partitions ahead, and the default
            conn.execute(
                sql.SQL("SELECT {}.history_partitions_step(30, 1000)").format(
                    sql.Identifier(schema)
                )
            )
        assert len(_partitions(conn, schema)) == 31
    ids = _finish(queue, 5)
    statements = {
        "job_get": {"id": ids[0]},
        "job_list": JobFilter(limit=50).params(),
    }
    with psycopg.connect(dsn) as conn:
        for name, params in statements.items():
            plan = conn.execute(
                sql.SQL("EXPLAIN (FORMAT JSON) ") + query(name, schema), params
            ).fetchone()
            assert plan is not None
            scans = [
                node
                for node in _plan_nodes(plan[0][0]["Plan"])
                if node.get("Relation Name", "").startswith("job_history")
            ]
            assert len(scans) == 31, (name, len(scans))
            kinds = {node["Node Type"] for node in scans}
            assert kinds <= {"Index Scan", "Index Only Scan"}, (name, json.dumps(plan[0]))
        conn.rollback()
    job = queue.get_job(ids[0])
    assert job is not None and job.status == "succeeded"


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found += _plan_nodes(child)
    return found


def test_a_seal_about_to_pass_unfinished_is_made_again_further_on(
    dsn: str, old_schema: str
) -> None:
    # The old table sealed long ago, and the steps after it never succeeded: rows finishing
    # past the bound would be refused. The upkeep drops that seal and seals again.
    schema = old_schema
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = _old_history(conn, schema, 5)
    with psycopg.connect(dsn) as conn:
        apply(conn, schema)
        conn.commit()
    with psycopg.connect(dsn, autocommit=True) as conn:
        soon = datetime.now(timezone.utc) + timedelta(hours=2)
        conn.execute(
            sql.SQL(
                "ALTER TABLE {}.job_history_legacy ADD CONSTRAINT job_history_legacy_sealed"
                " CHECK (finished_at < {}) NOT VALID"
            ).format(s, sql.Literal(soon))
        )
    steps = _upkeep(dsn, schema)
    assert "was about to pass: dropped, to seal again" in steps[0], steps
    sealed = _today() + timedelta(days=2)
    assert steps[1:4] == [
        f"sealed the existing history below {sealed:%Y-%m-%d} 00:00:00+00",
        "checked the existing history",
        f"the existing history is the partition below {sealed:%Y-%m-%d} 00:00:00+00",
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert set(_where(conn, schema)) == set(old)
