"""A worker and an enqueueing app run under the documented least-privilege roles."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobContext, Queue, RetryPolicy
from pgqueue.bulk import COPY_MIN_JOBS
from pgqueue.migrate import apply, grant_role
from pgqueue.queries import migrations, query
from pgqueue.store.workers import BeatParams, WorkerIdentity, WorkersStore
from pgqueue.testing import drain
from pgqueue.worker.rescuer import Rescuer
from tests.conftest import count, wait_until

# Run on each server CI tests against: grants are the server's.
pytestmark = pytest.mark.each_server


def _role_dsn(dsn: str, role: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info["user"] = role
    return psycopg.conninfo.make_conninfo("", **info)


@pytest.fixture
def roles(dsn: str, schema: str) -> Iterator[tuple[str, str]]:
    worker, app = f"pgq_w_{uuid.uuid4().hex[:8]}", f"pgq_a_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role in (worker, app):
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        grant_role(conn, schema, worker, "worker")
        grant_role(conn, schema, app, "app")
    yield _role_dsn(dsn, worker), _role_dsn(dsn, app)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role in (worker, app):
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_worker_and_app_roles_are_enough_to_enqueue_run_retry_and_read(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    owner = psycopg.connect(dsn, autocommit=True)
    worker_dsn, app_dsn = roles
    app = Queue(app_dsn, schema=schema)
    seen: list[int] = []

    @app.task(name="t", max_attempts=2, retry=RetryPolicy(base=0, jitter=0))
    def t(i: int) -> int:
        if i == 0 and not seen:
            seen.append(-1)
            raise RuntimeError("first attempt fails")  # exercises the retry path
        seen.append(i)
        return i

    app.set_concurrency_limit("k", 1, conn=owner)  # an admin's job, not the app's
    with psycopg.connect(app_dsn) as conn:
        ids = app.enqueue_many([t.job(i) for i in range(5)], conn=conn)
        ids += app.enqueue_many(  # keyed: the claim's slot upsert, parking, the trigger
            [t.with_options(concurrency_key="k").job(i) for i in range(5, 8)], conn=conn
        )
        bulk = range(100, 100 + COPY_MIN_JOBS)  # by COPY: the sequence's ids, then the rows
        ids += app.enqueue_many([t.job(i) for i in bulk], conn=conn)
        # From SQL, as a trigger or another language would.
        conn.execute(
            sql.SQL("SELECT {}.enqueue('t', %s::jsonb)").format(sql.Identifier(schema)),
            ['{"i": 50}'],
        )
        conn.execute(
            sql.SQL("SELECT * FROM {}.enqueue_many(%s::jsonb)").format(sql.Identifier(schema)),
            ['[{"task": "t", "args": {"i": 51}}, {"task": "t", "args": {"i": 52}}]'],
        )
        conn.commit()
    stats = drain(app, dsn=worker_dsn, concurrency=2)
    assert stats.claimed == 12 + COPY_MIN_JOBS
    assert sorted(seen) == [-1, 0, 1, 2, 3, 4, 5, 6, 7, 50, 51, 52, *bulk]
    job = app.get_job(ids[0])  # the app reads history back under its own role
    assert job is not None and job.status == "succeeded" and job.attempt == 2
    app.close()
    owner.close()


def _beat(conn: psycopg.Connection[Any], store: WorkersStore, worker_id: int) -> None:
    """A beat on `conn` that records its session, as a worker's heartbeat does."""
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)
    beat = store.heartbeat(conn, BeatParams(identity, worker_id, client_pid=conn.info.backend_pid))
    assert beat.recorded


def test_the_worker_role_finds_a_worker_whose_session_ended_and_rescues_its_job(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    """The session check under the worker role, for a dying worker of its own role (whose
    backend_start it may read) and of another (whose session it sees by pid alone)."""
    worker_dsn, _ = roles
    queue = Queue(dsn, schema=schema)

    @queue.task(name="held", max_attempts=1)
    def held() -> None: ...

    store = WorkersStore(schema)
    identity = WorkerIdentity(name="dying", hostname="h", pid=1, queues=["default"], concurrency=1)
    rescuer = Rescuer(
        queue.registry, schema, timedelta(minutes=1), True, session_grace=timedelta(0)
    )
    owner = psycopg.connect(dsn, autocommit=True)

    async def scenario(dying_dsn: str, job_id: int) -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(worker_dsn, autocommit=True) as aconn:
            worker_id = await store.register(aconn, identity)
            with psycopg.connect(dying_dsn, autocommit=True) as dying:
                _beat(dying, store, worker_id)
                owner.execute(
                    sql.SQL(
                        "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s,"
                        " started_at = now() WHERE id = %s"
                    ).format(sql.Identifier(schema)),
                    [worker_id, job_id],
                )
                while_open = await rescuer.rescue_gone(aconn)
                pid = dying.info.backend_pid
            wait_until(
                lambda: (
                    owner.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
                    ).fetchone()
                    == (0,)
                ),
                what="the dying worker's session to end",
            )
            return while_open, await rescuer.rescue_gone(aconn)

    for dying_dsn in (worker_dsn, dsn):
        (job_id,) = queue.enqueue_many([held.job()])
        assert asyncio.run(scenario(dying_dsn, job_id)) == (0, 1)
        assert count(owner, schema, "workers") == 0
        (errors,) = owner.execute(
            sql.SQL("SELECT errors FROM {}.job_history WHERE id = %s AND status = 'failed'").format(
                sql.Identifier(schema)
            ),
            [job_id],
        ).fetchone()  # type: ignore[misc]
        assert "session ended" in errors[-1]["error"]
    owner.close()
    queue.close()


def test_a_reused_pid_is_told_from_the_recorded_session_or_taken_as_alive(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    """A recorded session is its pid and its backend start: a live backend with the pid but
    another start is a reuse, and the worker is gone. The worker role may not read another
    role's backend_start (without pg_read_all_stats), so to it the same reuse looks alive."""
    worker_dsn, _ = roles
    store = WorkersStore(schema)
    identity = WorkerIdentity(name="w", hostname="h", pid=1, queues=["default"], concurrency=1)

    async def gone(as_dsn: str, other: psycopg.Connection[Any]) -> int:
        async with await psycopg.AsyncConnection.connect(as_dsn, autocommit=True) as aconn:
            worker_id = await store.register(aconn, identity)
            _beat(other, store, worker_id)
            # The pid now names a backend that started after the recorded one: a reuse.
            other.execute(
                sql.SQL(
                    "UPDATE {}.workers SET session_start = session_start - interval '1 millisecond'"
                    " WHERE id = %s"
                ).format(sql.Identifier(schema)),
                [worker_id],
            )
            found = [g.worker_id for g in await store.sessions_gone(aconn, 0)]
            await store.deregister(aconn, worker_id)
            assert found in ([], [worker_id])
            return len(found)

    with (
        psycopg.connect(dsn, autocommit=True) as owners,
        psycopg.connect(worker_dsn, autocommit=True) as workers,
    ):
        assert asyncio.run(gone(dsn, owners)) == 1  # the owner sees its own start
        assert asyncio.run(gone(worker_dsn, workers)) == 1  # its own role's, too
        assert asyncio.run(gone(worker_dsn, owners)) == 0  # another role's: taken as alive


def test_roles_cannot_change_the_schema_or_read_beyond_their_needs(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    worker_dsn, app_dsn = roles
    forbidden = [
        (worker_dsn, "CREATE TABLE {}.mine (x int)"),
        (worker_dsn, "DROP TABLE {}.jobs"),
        (worker_dsn, "DELETE FROM {}.migrations"),
        (app_dsn, "DELETE FROM {}.jobs"),
        (app_dsn, "UPDATE {}.jobs SET status = 'running'"),
        (app_dsn, "SELECT * FROM {}.workers"),
        (worker_dsn, "INSERT INTO {}.concurrency_limits VALUES ('k', 1)"),
        (app_dsn, "UPDATE {}.concurrency_slots SET running = 0"),
    ]
    for role_dsn, statement in forbidden:
        with psycopg.connect(role_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL(statement).format(sql.Identifier(schema)))


def test_the_app_role_dedupes_and_lists_and_the_worker_role_cancels_and_retries(
    schema: str, roles: tuple[str, str]
) -> None:
    worker_dsn, app_dsn = roles
    app = Queue(app_dsn, schema=schema)
    ops = Queue(worker_dsn, schema=schema)
    t = app.task(name="t", dedupe_window=600)(lambda: None)
    first = t.with_options(dedupe_key="k").enqueue()
    assert t.with_options(dedupe_key="k").enqueue() == first  # also reads history
    assert [job.id for job in app.list_jobs().jobs] == [first]
    assert ops.cancel_job(first) == "cancelled"
    retry = ops.retry_job(first)
    assert app.get_job(retry).retry_of == first  # type: ignore[union-attr]
    app.close()
    ops.close()


def test_the_worker_role_can_schedule_recurring_jobs_and_prune_history(
    schema: str, roles: tuple[str, str]
) -> None:
    import asyncio
    from datetime import datetime, timedelta, timezone

    from pgqueue.history.retention import Cutoff, Pruner, prune
    from pgqueue.runtime.link import Link
    from pgqueue.worker.scheduler import Scheduler

    worker_dsn, app_dsn = roles
    app = Queue(app_dsn, schema=schema)

    @app.periodic(every=60)
    @app.task(name="minutely")
    def minutely() -> None:
        pass

    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=timezone.utc)

    async def schedule_and_prune() -> int:
        async with await psycopg.AsyncConnection.connect(worker_dsn, autocommit=True) as conn:
            scheduler = Scheduler(app.periodics, schema, worker_id=1)
            await scheduler.run_pass(conn, now=start)
            done = await scheduler.run_pass(conn, now=start + timedelta(seconds=30))
        link = Link(worker_dsn, "prune")
        try:
            await Pruner(schema, timedelta(days=1), timedelta(minutes=1), 100).prune_once(link)
        finally:
            await link.close()
        return done.enqueued[0][2]

    job_id = asyncio.run(schedule_and_prune())
    job = app.get_job(job_id)
    assert job is not None and job.task == "minutely"
    with psycopg.connect(worker_dsn, autocommit=True) as conn:
        prune(conn, schema, Cutoff(timedelta(0)))  # the CLI's path, under the worker role
    with psycopg.connect(app_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("DELETE FROM {}.periodic_ticks").format(sql.Identifier(schema)))
    app.close()


def test_the_app_role_enqueues_workflows_and_the_worker_role_runs_them_under_rate_limits(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    from pgqueue import chain, chord, group

    worker_dsn, app_dsn = roles
    app = Queue(app_dsn, schema=schema)
    double = app.task(name="double")(lambda x: 2 * x)
    total = app.task(name="total")(lambda values: sum(values))
    with psycopg.connect(dsn, autocommit=True) as owner:
        app.set_rate_limit("default", 1000, per=1, conn=owner)  # an admin's job
        app.set_task_rate_limit(double, 1000, per=1, conn=owner)
        app.set_key_rate_limit(None, 1000, per=1, conn=owner)  # the worker makes keys' rows
    first = app.enqueue(double.with_options(concurrency_key="tenant").job(1))
    with psycopg.connect(app_dsn) as conn:
        flow = app.enqueue_workflow(
            chord(group(chain(double.job(2), double.s()), double.job(3)), total.s()),
            after=[first],  # marks and locks the earlier job: UPDATE (workflow_id) only
            conn=conn,
        )
        conn.commit()
    drain(app, dsn=worker_dsn, concurrency=2)
    job = app.get_job(flow.job_ids[-1])
    assert job is not None and job.status == "succeeded" and job.result == 8 + 6
    state = app.get_workflow(flow.id)
    assert state is not None and state.succeeded
    with psycopg.connect(dsn) as owner:
        counted = owner.execute(
            sql.SQL("SELECT name, counts FROM {}.job_rate_limits ORDER BY kind DESC, name").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    assert [(name, sum(counts)) for name, counts in counted] == [
        ("double", 4),
        ("*", 0),
        ("tenant", 1),
    ]
    with psycopg.connect(app_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(sql.SQL("UPDATE {}.jobs SET priority = 1").format(sql.Identifier(schema)))
    app.close()


def test_the_app_role_sends_signals_and_the_worker_role_records_steps_and_takes_them(
    schema: str, roles: tuple[str, str]
) -> None:
    worker_dsn, app_dsn = roles
    app = Queue(app_dsn, schema=schema)

    @app.task(name="durable_role")
    def durable_role(ctx: JobContext) -> Any:
        ctx.step("first", lambda: 1)
        return ctx.wait_for_signal("go")

    job_id = durable_role.enqueue()
    drain(app, dsn=worker_dsn)  # parks, as the worker role
    app.signal("go", {"by": "app"})  # the app role may not move jobs, but wakes this one
    drain(app, dsn=worker_dsn)
    job = app.get_job(job_id)
    assert job is not None and job.status == "succeeded" and job.result == {"by": "app"}
    from_sql = durable_role.enqueue()
    drain(app, dsn=worker_dsn)
    with psycopg.connect(app_dsn, autocommit=True) as conn:  # from SQL, as the app role
        conn.execute(
            sql.SQL("SELECT {}.signal('go', %s::jsonb)").format(sql.Identifier(schema)),
            ['{"by": "sql"}'],
        )
    drain(app, dsn=worker_dsn)
    job = app.get_job(from_sql)
    assert job is not None and job.status == "succeeded" and job.result == {"by": "sql"}
    app.close()


def test_the_app_roles_sql_enqueue_reads_the_declarations_the_worker_role_wrote(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    worker_dsn, app_dsn = roles
    runner = Queue(worker_dsn, schema=schema)

    @runner.task(name="mailer", queue="mail", max_attempts=2)
    def mailer() -> None: ...

    try:
        assert runner.sync_tasks() == ["mailer"]
    finally:
        runner.close()
    s = sql.Identifier(schema)
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT {}.enqueue('mailer')").format(s)).fetchone()
        assert row is not None
        stored = conn.execute(
            sql.SQL("SELECT queue, max_attempts FROM {}.jobs WHERE id = %s").format(s), row
        ).fetchone()
        assert stored == ("mail", 2)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql.SQL("UPDATE {}.tasks SET max_attempts = 9").format(s))


def test_roles_granted_before_the_declarations_existed_get_them_when_migrated(
    dsn: str,
) -> None:
    schema = f"pgq_test_{uuid.uuid4().hex[:12]}"
    worker, app = f"pgq_w_{uuid.uuid4().hex[:8]}", f"pgq_a_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            with conn.transaction():
                conn.execute(query("migration_table_create", schema))
                for migration in migrations():
                    if migration.name == "task_options":
                        break
                    conn.execute(migration.render(schema))
                    conn.execute(
                        query("migration_record", schema),
                        {"version": migration.version, "name": migration.name},
                    )
            for role in (worker, app):
                conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
            # The grants of that version, as `pgqueue grant` made them then.
            s = sql.Identifier(schema)
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {}.jobs TO {}").format(
                    s, sql.Identifier(worker)
                )
            )
            conn.execute(
                sql.SQL("GRANT INSERT, SELECT ON {}.jobs TO {}").format(s, sql.Identifier(app))
            )
            apply(conn, schema)
            privileges = {
                (role, kind): conn.execute(
                    "SELECT has_table_privilege(%s, %s, %s)", [role, f"{schema}.tasks", kind]
                ).fetchone()
                for role in (worker, app)
                for kind in ("SELECT", "UPDATE")
            }
            assert privileges == {
                (worker, "SELECT"): (True,),
                (worker, "UPDATE"): (True,),
                (app, "SELECT"): (True,),
                (app, "UPDATE"): (False,),
            }
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            for role in (worker, app):
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_a_worker_whose_role_may_not_write_declarations_says_so_and_runs(
    dsn: str, schema: str, roles: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    worker_dsn, _ = roles
    worker_role = psycopg.conninfo.conninfo_to_dict(worker_dsn)["user"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("REVOKE INSERT, UPDATE ON {}.tasks FROM {}").format(
                sql.Identifier(schema), sql.Identifier(str(worker_role))
            )
        )
    app = Queue(dsn, schema=schema)

    @app.task(name="mailer", queue="mail")
    def mailer() -> None: ...

    try:
        job = app.enqueue(mailer.job())
        with caplog.at_level("WARNING", logger="pgqueue.worker"):
            drain(app, dsn=worker_dsn, queues=["mail"])
        ran = app.get_job(job)
    finally:
        app.close()
    assert ran is not None and ran.status == "succeeded"
    assert any("may not write" in r.getMessage() for r in caplog.records), caplog.text
