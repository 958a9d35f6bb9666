"""Lease jobs' step records group-commit: the records a worker's jobs reach at the same time
go in together, one statement per round, and each is guarded on its own job.

The worker's StepRecorder counts its rounds and the records they carried: fewer rounds than
records is the evidence that records shared statements. An atomic job's record goes in the
same round trip as its segment's commit and the next segment's start.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import JobContext, Queue, Worker
from pgqueue.models import ClaimedJob
from pgqueue.runtime.link import Link
from pgqueue.store import plan
from pgqueue.store.steps import (
    Recorded,
    StepRecord,
    record_many_plan,
    record_plan,
    segment_next,
)
from pgqueue.worker.checkpoints import (
    AsyncAtomicBackend,
    AtomicBackend,
    JobLostError,
    StepRecorder,
)
from tests.conftest import wait_until, worker_in_thread

JOBS = 50
STEPS = 5


def statuses(dsn: str, schema: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT status, count(*) FROM (SELECT status FROM {s}.jobs"
                " UNION ALL SELECT status FROM {s}.job_history) AS j GROUP BY status"
            ).format(s=sql.Identifier(schema))
        ).fetchall()
    return dict(rows)


def recorded(dsn: str, schema: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            sql.SQL("SELECT job_id, seq, name, kind, result FROM {}.job_steps"
                    " ORDER BY job_id, seq").format(sql.Identifier(schema))
        ).fetchall()  # fmt: skip


class Meeting:
    """Lets `parties` coroutines of one event loop on together, once all of them wait."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.waiting = 0
        self.met: asyncio.Event | None = None  # made on the loop that waits

    async def wait(self) -> None:
        if self.met is None:
            self.met = asyncio.Event()
        self.waiting += 1
        if self.waiting == self.parties:
            self.met.set()
        await asyncio.wait_for(self.met.wait(), 60)


def step_result(n: int, k: int) -> dict[str, int]:
    return {"job": n, "step": k}


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_many_jobs_steps_on_one_worker_are_recorded_once_each_in_shared_rounds(
    dsn: str, schema: str, kind: str
) -> None:
    queue = Queue(dsn, schema=schema)
    # Every job waits at its first step until all of them are there, so their records are
    # asked for together (a round cannot carry what arrives one by one).
    gathered = threading.Barrier(JOBS, timeout=60)

    def meet(n: int) -> dict[str, int]:
        gathered.wait()
        return step_result(n, 1)

    @queue.task(name="threaded")
    def threaded(ctx: JobContext, n: int) -> list[Any]:
        got = [ctx.step("s1", meet, n)]
        got += [ctx.step(f"s{k}", step_result, n, k) for k in range(2, STEPS + 1)]
        return got

    agathered = Meeting(JOBS)

    async def ameet(n: int) -> dict[str, int]:
        await agathered.wait()
        return step_result(n, 1)

    async def astep_result(n: int, k: int) -> dict[str, int]:
        return step_result(n, k)

    @queue.task(name="awaited")
    async def awaited(ctx: JobContext, n: int) -> list[Any]:
        got = [await ctx.astep("s1", ameet, n)]
        for k in range(2, STEPS + 1):
            got.append(await ctx.astep(f"s{k}", astep_result, n, k))
        return got

    task = threaded if kind == "def" else awaited
    ids = queue.enqueue_many([task.job(n=n) for n in range(JOBS)])
    worker = Worker(queue, dsn=dsn, concurrency=JOBS, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: statuses(dsn, schema) == {"succeeded": JOBS}, what="every job")
        recorder = worker.current.executor.steps
    assert recorder is not None
    for n, job_id in enumerate(ids):
        job = queue.get_job(job_id)
        assert job is not None and job.attempt == 1, job
        assert job.result == [step_result(n, k) for k in range(1, STEPS + 1)]
    assert recorded(dsn, schema) == [
        (job_id, k, f"s{k}", "step", step_result(n, k))
        for n, job_id in enumerate(ids)
        for k in range(1, STEPS + 1)
    ]
    assert recorder.records == JOBS * STEPS
    assert recorder.rounds < recorder.records, (recorder.rounds, recorder.records)


def test_a_record_whose_job_was_rescued_meanwhile_fails_that_job_s_step_alone(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    others = 9
    # The test is the last party: it moves one job away while every job waits in step 2.
    at_step_two = threading.Barrier(others + 2, timeout=60)
    failures: dict[int, str] = {}

    def second(n: int) -> str:
        at_step_two.wait()
        return f"two of {n}"

    @queue.task(name="two_steps")
    def two_steps(ctx: JobContext, n: int) -> list[str]:
        got = [ctx.step("one", lambda: f"one of {n}")]
        try:
            got.append(ctx.step("two", second, n))
        except Exception as exc:
            failures[ctx.job_id] = f"{type(exc).__name__}: {exc}"
            raise
        return got

    ids = queue.enqueue_many([two_steps.job(n=n) for n in range(others + 1)])
    lost = ids[0]
    worker = Worker(queue, dsn=dsn, concurrency=others + 1, poll_interval=0.1)
    with worker_in_thread(worker):
        wait_until(lambda: at_step_two.n_waiting == others + 1, what="every job at step 2")
        # As a rescuer does for a job whose worker's lease lapsed: not this worker's anymore.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {}.jobs SET status = 'scheduled', worker_id = NULL,"
                    " run_at = now() + interval '1 hour' WHERE id = %s"
                ).format(sql.Identifier(schema)),
                [lost],
            )
        at_step_two.wait()
        wait_until(lambda: statuses(dsn, schema).get("succeeded") == others, what="the others")
        wait_until(lambda: lost in failures, what="the lost job's step to fail")
    lost_step = f"JobLostError: job {lost} is no longer this worker's: step 2 'two' was"
    assert failures == {lost: f"{lost_step} not recorded"}
    assert statuses(dsn, schema) == {"succeeded": others, "scheduled": 1}
    steps = recorded(dsn, schema)
    assert [(seq, name) for job_id, seq, name, _, _ in steps if job_id == lost] == [(1, "one")]
    for n, job_id in enumerate(ids[1:], start=1):
        job = queue.get_job(job_id)
        assert job is not None and job.result == [f"one of {n}", f"two of {n}"], job


def test_one_round_records_the_jobs_still_ours_and_leaves_out_the_ones_moved(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    queue.migrate()

    @queue.task(name="noop")
    def noop() -> None:
        pass

    ids = queue.enqueue_many([noop.job() for _ in range(5)])
    kept, sleeper, again, moved, gone = ids
    with psycopg.connect(dsn, autocommit=True) as conn:
        s = sql.Identifier(schema)
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET status = 'running', worker_id = 7, attempt = 1,"
                " started_at = now() WHERE id = ANY(%s)"
            ).format(s),
            [ids],
        )
        # Rescued and claimed again, by this same worker: a later attempt's.
        conn.execute(sql.SQL("UPDATE {}.jobs SET attempt = 2 WHERE id = %s").format(s), [moved])
        conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE id = %s").format(s), [gone])
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.job_steps (job_id, seq, name, kind, result)"
                " VALUES (%s, 1, 'first', 'step', '\"earlier\"')"
            ).format(s),
            [again],
        )

    def record(job_id: int, result: str | None, sleep: float | None = None) -> StepRecord:
        job = ClaimedJob(job_id, "noop", {}, 0, 1, 3, "default", 7)
        step = Recorded(1, "first", "step" if sleep is None else "sleep", None)
        return StepRecord(job, step, datetime.now(timezone.utc), result, sleep)

    async def one_round() -> tuple[Any, StepRecorder]:
        recorder = StepRecorder(Link(dsn, "steps"), schema)
        try:
            made = await asyncio.gather(
                recorder.record(record(kept, '{"a": [1, null]}')),
                recorder.record(record(sleeper, None, sleep=60.0)),
                recorder.record(record(again, '"now"')),
                recorder.record(record(moved, '"late"')),
                recorder.record(record(gone, "null")),
            )
        finally:
            await recorder.link.close()
        return made, recorder

    made, recorder = asyncio.run(one_round())
    assert (recorder.rounds, recorder.records) == (1, 5)
    first, slept, earlier, late, none = made
    assert first is not None and first[0] == Recorded(1, "first", "step", {"a": [1, None]})
    assert slept is not None and slept[0].kind == "sleep"
    until = datetime.fromisoformat(slept[0].result["until"])
    assert until > slept[1]  # ends after it was recorded, by the database's clock
    assert earlier is not None and earlier[0] == Recorded(1, "first", "step", "earlier")
    assert late is None and none is None
    assert [(job_id, result) for job_id, _, _, _, result in recorded(dsn, schema)] == [
        (kept, {"a": [1, None]}),
        (sleeper, slept[0].result),
        (again, "earlier"),
    ]


@pytest.mark.parametrize("rescue", ["commits", "rolls back"])
def test_a_round_racing_a_rescue_waits_for_it_and_records_by_its_outcome(
    dsn: str, schema: str, rescue: str
) -> None:
    queue = Queue(dsn, schema=schema)
    queue.migrate()

    @queue.task(name="noop")
    def noop() -> None:
        pass

    ids = queue.enqueue_many([noop.job() for _ in range(2)])
    kept, raced = ids
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET status = 'running', worker_id = 7, attempt = 1,"
                " started_at = now() WHERE id = ANY(%s)"
            ).format(s),
            [ids],
        )

    def record(job_id: int) -> StepRecord:
        job = ClaimedJob(job_id, "noop", {}, 0, 1, 3, "default", 7)
        return StepRecord(job, Recorded(1, "first", "step", None), datetime.now(timezone.utc), "1")

    def blocked(conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgqueue:steps'"
            " AND wait_event_type = 'Lock'"
        ).fetchone()
        return row is not None and row[0] == 1

    async def race(rescuer: psycopg.Connection[Any]) -> list[Any]:
        recorder = StepRecorder(Link(dsn, "steps"), schema)
        try:
            made = asyncio.gather(recorder.record(record(kept)), recorder.record(record(raced)))
            with psycopg.connect(dsn, autocommit=True) as watcher:
                await asyncio.to_thread(wait_until, lambda: blocked(watcher), what="the wait")
            if rescue == "commits":
                rescuer.commit()
            else:
                rescuer.rollback()
            return list(await made)
        finally:
            await recorder.link.close()

    with psycopg.connect(dsn) as rescuer:
        # A rescue in flight: the job's row locked, moved, not yet committed.
        rescuer.execute(
            sql.SQL("UPDATE {}.jobs SET status = 'queued', worker_id = NULL WHERE id = %s").format(
                s
            ),
            [raced],
        )
        first, second = asyncio.run(race(rescuer))
    assert first is not None and first[0].result == 1
    if rescue == "commits":
        assert second is None
        assert [row[0] for row in recorded(dsn, schema)] == [kept]
    else:
        assert second is not None and second[0].result == 1
        assert [row[0] for row in recorded(dsn, schema)] == [kept, raced]


@pytest.mark.parametrize("guard", ["one record", "two records", "segment lock"])
def test_a_guard_probes_its_job_by_primary_key_whatever_plan_is_cached(
    dsn: str, schema: str, guard: str
) -> None:
    """Before the jobs table's statistics are first taken, a cached generic plan of a guard
    that names the running status walked the partial index of running jobs (whose dead
    entries a long transaction keeps) instead of the job's primary key. A step's record,
    alone or with others, and an atomic job's relock at a segment's start probe the key."""
    count = 2 if guard == "two records" else 1
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (task, queue, args, status, worker_id, attempt)"
                    " SELECT 't', 'default', '{{}}', 'running', 7, 1 FROM generate_series(1, %s)"
                    " RETURNING id"
                ).format(sql.Identifier(schema)),
                [count],
            ).fetchall()
        ]
    jobs = [ClaimedJob(i, "t", {}, 0, 1, 3, "default", 7) for i in ids]
    running_scans = sql.SQL("SELECT pg_stat_get_xact_numscans({}::regclass)").format(
        sql.Literal(f'"{schema}".jobs_running_idx')
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("BEGIN")
        conn.execute("SAVEPOINT pgqueue_segment")  # where an atomic job's segment stands
        started = datetime.now(timezone.utc)
        for seq in range(1, 8):  # past the connection's prepare threshold
            if guard == "segment lock":
                assert plan.run_pipelined(conn, segment_next(schema, jobs[0]))
                continue
            batch = [
                StepRecord(job, Recorded(seq, f"s{seq}", "step", None), started, "1")
                for job in jobs
            ]
            made = plan.run(conn, record_many_plan(schema, batch), together=False)
            assert all(m is not None and m[0].result == 1 for m in made), made
        # Counted in this transaction: for the segment lock, the last segment's, by then
        # planned generically.
        scans = conn.execute(running_scans).fetchone()
        conn.execute("ROLLBACK")
    assert scans == (0,), "a guard walked jobs_running_idx"


# -- an atomic job's record, sent with its segment's end ------------------------------------------


def _running_job(dsn: str, schema: str) -> ClaimedJob:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (task, queue, args, status, worker_id, attempt)"
                " VALUES ('t', 'default', '{{}}', 'running', 7, 1) RETURNING id"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return ClaimedJob(row[0], "t", {}, 0, 1, 3, "default", 7)


def _app_rows(dsn: str, schema: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [
            r[0]
            for r in conn.execute(sql.SQL("SELECT n FROM {}.app").format(sql.Identifier(schema)))
        ]


@pytest.mark.parametrize("kind", ["def", "async def"])
@pytest.mark.parametrize("moved", [False, True])
def test_an_atomic_record_commits_its_segment_and_the_relock_tells_if_the_job_is_ours(
    dsn: str, schema: str, kind: str, moved: bool
) -> None:
    """An atomic job's step record goes in one round trip with its segment's commit and the
    next segment's start: the record and the handler's writes commit together, and the `end`
    that follows raises JobLostError when the relock found the job no longer this worker's
    (here moved by another session before the segment ended), or leaves the next segment
    open with the job's row locked."""
    job = _running_job(dsn, schema)
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {}.app (n int)").format(s))
        if moved:
            conn.execute(sql.SQL("UPDATE {}.jobs SET worker_id = 8 WHERE id = %s").format(s),
                         [job.id])  # fmt: skip
    step = StepRecord(job, Recorded(1, "s1", "step", None), datetime.now(timezone.utc), '{"a": 1}')

    def blocking() -> tuple[Any, BaseException | None]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("SAVEPOINT pgqueue_segment")
            conn.execute(sql.SQL("INSERT INTO {}.app VALUES (1)").format(s))
            backend = AtomicBackend(conn, schema, job)
            made = backend.record(lambda: record_plan(schema, step), step)
            try:
                backend.end(True)
            except JobLostError as exc:
                return made, exc
            locked = _locked_elsewhere(dsn, schema, job.id)
            conn.execute("ROLLBACK")
            return (made, locked), None

    async def awaited() -> tuple[Any, BaseException | None]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("BEGIN")
            await conn.execute("SAVEPOINT pgqueue_segment")
            await conn.execute(sql.SQL("INSERT INTO {}.app VALUES (1)").format(s))
            backend = AsyncAtomicBackend(conn, schema, job)
            made = await backend.arecord(lambda: record_plan(schema, step), step)
            try:
                await backend.aend(True)
            except JobLostError as exc:
                return made, exc
            locked = await asyncio.to_thread(_locked_elsewhere, dsn, schema, job.id)
            await conn.execute("ROLLBACK")
            return (made, locked), None

    got, lost = blocking() if kind == "def" else asyncio.run(awaited())
    assert _app_rows(dsn, schema) == [1]  # committed with the record
    assert [(r[0], r[1]) for r in recorded(dsn, schema)] == [(job.id, 1)]
    if moved:
        assert isinstance(lost, JobLostError) and str(job.id) in str(lost)
        assert got is not None and got[0].result == {"a": 1}
    else:
        assert lost is None
        made, locked = got
        assert made is not None and made[0] == Recorded(1, "s1", "step", {"a": 1})
        assert locked, "the next segment did not lock the job's row"


def _locked_elsewhere(dsn: str, schema: str, job_id: int) -> bool:
    """Whether the job's row is locked by another transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(
                sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s FOR UPDATE NOWAIT").format(
                    sql.Identifier(schema)
                ),
                [job_id],
            )
        except psycopg.errors.LockNotAvailable:
            return True
    return False


def test_an_atomic_record_already_made_is_an_error_and_its_segment_does_not_commit(
    dsn: str, schema: str
) -> None:
    """A step already recorded at the same place (which the job's row lock rules out) is
    the database's error, and neither the record nor the handler's writes commit."""
    job = _running_job(dsn, schema)
    s = sql.Identifier(schema)
    step = StepRecord(job, Recorded(1, "s1", "step", None), datetime.now(timezone.utc), "1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {}.app (n int)").format(s))
        assert plan.run(conn, record_plan(schema, step), together=False) is not None
        conn.execute("BEGIN")
        conn.execute("SAVEPOINT pgqueue_segment")
        conn.execute(sql.SQL("INSERT INTO {}.app VALUES (2)").format(s))
        with pytest.raises(psycopg.errors.UniqueViolation):
            AtomicBackend(conn, schema, job).record(lambda: record_plan(schema, step), step)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        conn.execute("ROLLBACK")
    assert _app_rows(dsn, schema) == []
