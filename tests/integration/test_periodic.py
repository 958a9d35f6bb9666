"""Recurring jobs on a real PostgreSQL: each tick is one job, whatever races it, and missed
ticks follow the definition's policy. Time is injected into the passes wherever possible."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker
from pgqueue.store.periodic import PeriodicStore
from pgqueue.worker.scheduler import Scheduler
from tests.apps.tasks import read_runs
from tests.conftest import ROOT, count, wait_until, worker_in_thread

# Run on each server CI tests against: one tick at a time through the server's locks.
pytestmark = pytest.mark.each_server

UTC = timezone.utc
T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)  # a whole hour, so every 5-minute tick


def five_minutes(queue: Queue, missed: Literal["skip", "run_once"] = "skip") -> None:
    @queue.periodic(cron="*/5 * * * *", missed=missed, args={"label": "five"})
    @queue.task(name="report")
    def report(label: str) -> str:
        return label


def passes(dsn: str, schema: str, queue: Queue, *instants: datetime) -> list[list[Any]]:
    """One pass of a fresh scheduler (a worker that just started) at each instant."""

    async def run() -> list[list[Any]]:
        done = []
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for instant in instants:
                scheduler = Scheduler(queue.periodics, schema, worker_id=1)
                done.append((await scheduler.run_pass(conn, now=instant)).enqueued)
        return done

    return asyncio.run(run())


def periodic_worker(dsn: str, schema: str, *args: str, log: Path, env: dict[str, str]) -> Any:
    """`python -m pgqueue worker tests.apps.periodic_app:queue` as a real process."""
    import os

    full_env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    command = [sys.executable, "-m", "pgqueue", "worker", "tests.apps.periodic_app:queue"]
    with open(log, "w") as out:
        return subprocess.Popen(
            [*command, "--dsn", dsn, "--schema", schema, *args],
            cwd=ROOT,
            env=full_env | env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def ticks(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        sql.SQL("SELECT name, tick, job_id, worker_id FROM {}.periodic_ticks ORDER BY tick").format(
            sql.Identifier(schema)
        )
    ).fetchall()


def test_first_start_enqueues_nothing_from_the_past_then_each_tick_once(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    queue = Queue(dsn, schema=schema)
    five_minutes(queue)
    first, on_time, again, next_one = passes(
        dsn,
        schema,
        queue,
        T0 + timedelta(minutes=3),
        T0 + timedelta(minutes=5, seconds=1),
        T0 + timedelta(minutes=5, seconds=30),  # another worker, same tick: nothing new
        T0 + timedelta(minutes=10),
    )
    assert first == [] and again == []
    assert [tick for _, tick, _ in on_time] == [T0 + timedelta(minutes=5)]
    assert [tick for _, tick, _ in next_one] == [T0 + timedelta(minutes=10)]
    job = queue.get_job(on_time[0][2])
    assert job is not None and job.task == "report" and job.args == {"label": "five"}
    assert count(conn, schema, "jobs") == 2
    assert [row[2] for row in ticks(conn, schema)] == [on_time[0][2], next_one[0][2]]
    queue.close()


def test_ticks_missed_while_no_worker_ran_are_skipped_by_default(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    queue = Queue(dsn, schema=schema)
    five_minutes(queue, missed="skip")
    _, after_outage, resumed = passes(
        dsn, schema, queue, T0, T0 + timedelta(minutes=17), T0 + timedelta(minutes=20)
    )
    assert after_outage == []
    assert [tick for _, tick, _ in resumed] == [T0 + timedelta(minutes=20)]
    assert count(conn, schema, "jobs") == 1


def test_ticks_missed_while_no_worker_ran_run_once_for_the_latest(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    queue = Queue(dsn, schema=schema)
    five_minutes(queue, missed="run_once")
    _, after_outage, same_again, resumed = passes(
        dsn,
        schema,
        queue,
        T0,
        T0 + timedelta(minutes=17),
        T0 + timedelta(minutes=18),
        T0 + timedelta(minutes=20),
    )
    assert [tick for _, tick, _ in after_outage] == [T0 + timedelta(minutes=15)]
    assert same_again == []  # the catch-up job stands for all missed ticks, once
    assert [tick for _, tick, _ in resumed] == [T0 + timedelta(minutes=20)]
    assert count(conn, schema, "jobs") == 2


def test_a_changed_definition_does_not_catch_up_the_old_outage(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    old = Queue(dsn, schema=schema)
    five_minutes(old, missed="run_once")
    passes(dsn, schema, old, T0)
    new = Queue(dsn, schema=schema)

    @new.periodic(cron="*/10 * * * *", missed="run_once", name="report")
    @new.task(name="report")
    def report(label: str = "ten") -> str:
        return label

    (changed,) = passes(dsn, schema, new, T0 + timedelta(minutes=33))
    assert changed == []
    row = conn.execute(
        sql.SQL("SELECT definition->>'cron' FROM {}.periodic WHERE name = 'report'").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    assert row == ("*/10 * * * *",)
    (resumed,) = passes(dsn, schema, new, T0 + timedelta(minutes=40))
    assert [tick for _, tick, _ in resumed] == [T0 + timedelta(minutes=40)]


def test_a_tick_claimed_before_is_never_enqueued_again_whatever_the_state_says(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    """The primary key guards each tick by itself, without the row lock's help: a tick row
    already present (another worker claimed it) means no job, even if last_tick lags."""
    queue = Queue(dsn, schema=schema)
    five_minutes(queue)
    passes(dsn, schema, queue, T0)
    conn.execute(
        sql.SQL("INSERT INTO {}.periodic_ticks (name, tick) VALUES ('report', %s)").format(
            sql.Identifier(schema)
        ),
        [T0 + timedelta(minutes=5)],
    )
    conn.commit()
    (lagging,) = passes(dsn, schema, queue, T0 + timedelta(minutes=5, seconds=1))
    assert lagging == []
    assert count(conn, schema, "jobs") == 0


def test_a_rolled_back_pass_leaves_its_tick_for_the_next_pass(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    queue = Queue(dsn, schema=schema)
    five_minutes(queue)
    passes(dsn, schema, queue, T0)
    # Make job_insert fail inside the pass, after the tick was claimed: the whole pass,
    # tick claim included, must roll back.
    conn.execute(
        sql.SQL(
            "ALTER TABLE {}.jobs ADD CONSTRAINT refuse_for_a_while CHECK (task <> 'report')"
        ).format(sql.Identifier(schema))
    )
    conn.commit()
    try:
        passes(dsn, schema, queue, T0 + timedelta(minutes=5, seconds=1))
    except psycopg.errors.CheckViolation:
        pass
    else:
        raise AssertionError("the pass should have failed on the refused insert")
    assert ticks(conn, schema) == []
    conn.execute(
        sql.SQL("ALTER TABLE {}.jobs DROP CONSTRAINT refuse_for_a_while").format(
            sql.Identifier(schema)
        )
    )
    conn.commit()
    (retried,) = passes(dsn, schema, queue, T0 + timedelta(minutes=5, seconds=20))
    assert [tick for _, tick, _ in retried] == [T0 + timedelta(minutes=5)]


def test_racing_processes_enqueue_each_tick_exactly_once(
    dsn: str, schema: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Four OS processes pass at the same 300 injected instants, released together."""
    first, steps, racers = 1_800_000_000, 300, 4  # a whole minute (and 2-minute) boundary
    race = [sys.executable, "-m", "tests.apps.periodic_race"]
    procs = [
        subprocess.Popen(
            [*race, dsn, schema, str(worker), str(tmp_path), str(first), str(steps), str(racers)],
            cwd=ROOT,
        )
        for worker in range(1, racers + 1)
    ]
    try:
        wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == racers, what="racers to connect")
        (tmp_path / "go").touch()
        for proc in procs:
            assert proc.wait(timeout=120) == 0
    finally:
        for proc in procs:
            proc.kill() if proc.poll() is None else None
    rows = ticks(conn, schema)
    per_name = {name: [r for r in rows if r[0] == name] for name in {r[0] for r in rows}}
    start = datetime.fromtimestamp(first, UTC)
    assert [r[1] for r in per_name["each_second"]] == [
        start + timedelta(seconds=k) for k in range(1, steps)
    ]
    assert [r[1] for r in per_name["every_two_minutes"]] == [
        start + timedelta(minutes=2),
        start + timedelta(minutes=4),
    ]
    job_ids = [r[2] for r in rows]
    assert None not in job_ids and len(set(job_ids)) == len(rows)
    assert count(conn, schema, "jobs") == len(rows) == steps - 1 + 2
    winners = {r[3] for r in rows}
    assert len(winners) > 1, f"only worker {winners} ever won: the race did not happen"


def test_worker_processes_run_each_real_tick_once(
    dsn: str, schema: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Three `pgqueue worker` processes schedule an every-second job on real time."""
    env = {"PGQUEUE_TEST_RUNS": str(tmp_path)}
    args = ("--concurrency", "2", "--shutdown-grace", "5")
    procs = [
        periodic_worker(dsn, schema, *args, log=tmp_path / f"w{n}.log", env=env) for n in range(3)
    ]
    try:
        wait_until(lambda: len(read_runs(tmp_path)) >= 4, what="four ticks to run")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
    rows = ticks(conn, schema)
    ran = [job_id for job_id, _ in read_runs(tmp_path)]
    assert len(ran) == len(set(ran)), "a tick's job ran twice"
    assert set(ran) <= {r[2] for r in rows}
    assert count(conn, schema, "jobs") + count(conn, schema, "job_history") == len(rows)
    assert all(r[1].microsecond == 0 for r in rows)
    assert len({r[1] for r in rows}) == len(rows)


def test_the_scheduler_survives_a_terminated_connection_and_stops_cleanly(
    own_database: str,
) -> None:
    with psycopg.connect(own_database, autocommit=True) as admin:
        from pgqueue.migrate import apply

        apply(admin, "pgqueue")
        queue = Queue(own_database)

        @queue.periodic(every=1)
        @queue.task(name="tick")
        def tick() -> None:
            pass

        worker = Worker(queue, dsn=own_database, poll_interval=0.2)
        with worker_in_thread(worker):
            wait_until(lambda: count(admin, "pgqueue", "job_history") >= 1, what="a first tick")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'pgqueue:periodic' AND datname = current_database()"
            )
            seen = count(admin, "pgqueue", "periodic_ticks")
            wait_until(
                lambda: count(admin, "pgqueue", "periodic_ticks") >= seen + 2,
                what="ticks after the connection came back",
            )
        assert worker.current.scheduler is not None and worker.current.scheduler.passes >= 3
        left = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue:periodic'"
            " AND datname = current_database()"
        ).fetchone()
        assert left == (0,)
        queue.close()


def test_a_worker_started_without_periodic_schedules_nothing(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.periodic(every=1)
    @queue.task(name="tick")
    def tick() -> None:
        pass

    @queue.task(name="plain")
    def plain() -> None:
        pass

    worker = Worker(queue, dsn=dsn, periodic=False, poll_interval=0.2)
    with worker_in_thread(worker):
        plain.enqueue()
        wait_until(lambda: count(conn, schema, "job_history") == 1, what="the plain job")
        assert worker.current.scheduler is None
    assert count(conn, schema, "periodic") == 0
    queue.close()


def test_a_worker_frozen_mid_pass_holds_up_the_others_only_until_the_backstop(
    dsn: str, schema: str, conn: psycopg.Connection[Any]
) -> None:
    import concurrent.futures
    import contextlib
    import threading

    queue = Queue(dsn, schema=schema)
    five_minutes(queue)
    passes(dsn, schema, queue, T0)
    frozen, release = threading.Event(), threading.Event()

    class Freezing(PeriodicStore):
        async def claim_ticks(self, *args: Any) -> Any:
            frozen.set()
            release.wait(120)  # blocks this worker's event loop with the row locks held
            return await super().claim_ticks(*args)

    async def freeze() -> None:
        scheduler = Scheduler(queue.periodics, schema, 2, idle_backstop=timedelta(seconds=1))
        scheduler.store = Freezing(schema)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
            await scheduler.run_pass(own, now=T0 + timedelta(minutes=5, seconds=1))

    def frozen_worker() -> None:
        # Its session is ended while it is frozen: its pass then fails, as it should.
        with contextlib.suppress(psycopg.Error):
            asyncio.run(freeze())

    thread = threading.Thread(target=frozen_worker)
    thread.start()
    try:
        assert frozen.wait(30)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            other = pool.submit(
                passes, dsn, schema, queue, T0 + timedelta(minutes=5, seconds=2)
            ).result(timeout=30)
        assert [tick for _, tick, _ in other[0]] == [T0 + timedelta(minutes=5)]
    finally:
        release.set()
        thread.join(60)
    assert count(conn, schema, "jobs") == 1
