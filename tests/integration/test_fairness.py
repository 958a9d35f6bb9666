"""Fair shares across keys: within a priority, backlogged keys get started jobs in proportion
to their weights, and a key without a backlog gets its next job started at once.

Enqueues stamp each fair job with a virtual start time (vtime) from its key's clock and the
queue's; the fair claim (job_claim_fair) takes jobs in (priority, vtime) order from its
hint. The order is deterministic given the vtimes, so the shares are checked exactly, with
one worker. The EXPLAIN check of the fair claim is in test_claim_plan.py.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgqueue import ConfigurationError, InvalidArgumentsError, Queue
from pgqueue.queries import query
from pgqueue.testing import drain

# Run on each server CI tests against: fair claims are the server's plans and locks.
pytestmark = pytest.mark.each_server


def fair_claim(
    db: Any, schema: str, after: tuple[int, float] = (-32768, float("-inf")), limit: int = 10
) -> tuple[list[int], tuple[int, float] | None]:
    """One job_claim_fair of the default queue: the ids claimed, and the top position."""
    params = {
        "queue": "default",
        "after_priority": after[0],
        "after_vtime": after[1],
        "before_priority": 32767,
        "before_vtime": float("inf"),
        "limit": limit,
        "worker_id": 1,
        "now": None,
    }
    rows = db.execute(query("job_claim_fair", schema), params).fetchall()
    top = max(((r[3], r[11]) for r in rows), default=None)
    return [r[0] for r in rows if not r[8]], top


def test_backlogged_keys_start_jobs_in_proportion_to_their_weights(queue: Queue) -> None:
    weights = {"a": 1, "b": 2, "c": 4}
    for key, weight in weights.items():
        queue.set_fairness_weight(key, weight)
    order: list[str] = []
    lock = threading.Lock()

    @queue.task(name="fair", fairness_key="{key}")
    def fair(key: str, i: int) -> None:
        with lock:
            order.append(key)

    for key in weights:  # each key's whole backlog at once, the heaviest last
        queue.enqueue_many([fair.job(key, i) for i in range(200)])
    drain(queue, concurrency=1, batch_size=5)
    assert len(order) == 600
    first = Counter(order[:140])  # all three stay backlogged through these
    for key, weight in weights.items():
        owed = 140 * weight / 7
        assert abs(first[key] - owed) <= 0.1 * owed, (first, key)


def test_a_key_without_a_backlog_gets_its_job_started_in_the_next_claim(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    flood = app.with_options(fairness_key="flood")
    queue.enqueue_many([flood.job(i) for i in range(10_000)])
    after = None
    for _ in range(3):
        _, after = fair_claim(db, schema, after or (-32768, float("-inf")))
    assert after is not None
    quiet = queue.enqueue(app.with_options(fairness_key="quiet").job(-1))
    claimed, _ = fair_claim(db, schema, after)
    assert quiet in claimed  # not behind the 9,970 flood jobs still queued
    # The plain claim, first in first out, would have reached it after all of them.
    plain = db.execute(
        f'SELECT count(*) FROM "{schema}".jobs WHERE status = %s AND id < %s', ["queued", quiet]
    ).fetchone()
    assert plain[0] > 9_000


def test_each_key_keeps_its_own_order_and_the_queue_clock_follows_the_claims(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    a = queue.enqueue_many([app.with_options(fairness_key="a").job(i) for i in range(6)])
    b = queue.enqueue_many([app.with_options(fairness_key="b").job(i) for i in range(2)])
    claimed, top = fair_claim(db, schema, limit=4)
    assert sorted(claimed) == [a[0], a[1], b[0], b[1]]  # vtimes 0, 1 each; FIFO: a[:4]
    clock = db.execute(f'SELECT "{schema}".fairness_clock(%s)', ["default"]).fetchone()
    assert top == (0, 1.0) and clock == (1.0,)
    claimed, _ = fair_claim(db, schema, top, limit=10)
    assert sorted(claimed) == a[2:]


def test_a_job_back_in_the_queue_is_not_left_behind_the_clock(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    ids = queue.enqueue_many([app.with_options(fairness_key="a").job(i) for i in range(20)])
    claimed, top = fair_claim(db, schema, limit=10)
    assert sorted(claimed) == ids[:10] and top == (0, 9.0)
    claimed.sort()
    db.execute(query("job_release_many", schema), {"ids": claimed[:1], "worker_id": 1})
    vtime = db.execute(f'SELECT vtime FROM "{schema}".jobs WHERE id = %s', claimed[:1]).fetchone()
    assert vtime == (9.0,)  # restamped from 0 to the queue's clock: the hint reaches it
    again, _ = fair_claim(db, schema, top, limit=1)
    assert again == claimed[:1]


def test_fairness_keys_come_from_templates_and_bad_input_is_refused(
    queue: Queue, db: Any, schema: str
) -> None:
    @queue.task(name="report", fairness_key="tenant:{tenant_id}")
    def report(tenant_id: int) -> None: ...

    job = report.enqueue(42)
    row = db.execute(
        f'SELECT fairness_key, vtime FROM "{schema}".jobs WHERE id = %s', [job]
    ).fetchone()
    assert row == ("tenant:42", 0.0)
    with pytest.raises(ConfigurationError, match="names 'tenant'"):

        @queue.task(name="bad", fairness_key="{tenant}")
        def bad(tenant_id: int) -> None: ...

    with pytest.raises(InvalidArgumentsError, match="needs the argument 'user'"):
        report.with_options(fairness_key="{user}").job(1)
    with pytest.raises(ConfigurationError, match="atomic and cannot take fairness_key"):

        @queue.task(name="at", atomic=True, fairness_key="a")
        async def at() -> None: ...

    for weight in (0, -1, True, 2_000_000):
        with pytest.raises(ConfigurationError, match=f"weight={weight!r}"):
            queue.set_fairness_weight("a", weight)
    with pytest.raises(ConfigurationError, match="invalid fairness key"):
        queue.set_fairness_weight("", 1)


def test_shares_received_are_listed_against_shares_owed(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_fairness_weight("b", 3)
    for key in ("a", "b"):
        queue.enqueue_many([app.with_options(fairness_key=key).job(i) for i in range(40)])
    fair_claim(db, schema, limit=20)
    shares = {s.key: s for s in queue.fair_shares(window=600)}
    assert shares["a"].started == 5 and shares["b"].started == 15
    assert shares["a"].share == pytest.approx(0.25) and shares["a"].owed == pytest.approx(0.25)
    assert shares["b"].weight == 3 and shares["b"].queued == 25 and shares["b"].running == 15


def test_jobs_without_a_key_in_a_fair_queue_still_run(queue: Queue, app: Any) -> None:
    fair = queue.enqueue_many([app.with_options(fairness_key="a").job(i) for i in range(30)])
    plain = queue.enqueue_many([app.job(i) for i in range(30)])
    drain(queue, concurrency=4, batch_size=5)
    for job_id in fair + plain:
        job = queue.get_job(job_id)
        assert job is not None and job.status == "succeeded"


def test_a_job_committed_after_claims_passed_its_stamp_is_moved_up_to_the_clock(
    queue: Queue, app: Any, db: Any, schema: str, dsn: str
) -> None:
    """An idle key's job is stamped with the queue's clock when it is inserted; claims that
    run before it commits move the clock and their hints past that stamp. At commit it is
    moved up to the clock (migration 0030), so the next claim from the hint reaches it."""
    queue.enqueue_many([app.with_options(fairness_key="flood").job(i) for i in range(100)])
    with psycopg.connect(dsn) as late:
        quiet = queue.enqueue(app.with_options(fairness_key="quiet").job(-1), conn=late)
        stamped = late.execute(f'SELECT vtime FROM "{schema}".jobs WHERE id = %s', [quiet])
        assert stamped.fetchone() == (0.0,)
        _, top = fair_claim(db, schema, limit=30)  # the clock moves on to 29 meanwhile
        assert top == (0, 29.0)
        late.commit()
    row = db.execute(f'SELECT vtime FROM "{schema}".jobs WHERE id = %s', [quiet]).fetchone()
    assert row == (29.0,)
    claimed, _ = fair_claim(db, schema, top, limit=5)
    assert quiet in claimed


def test_a_paused_fair_queue_runs_nothing_until_resumed(queue: Queue, app: Any) -> None:
    queue.pause_queue("default")
    fair = app.with_options(fairness_key="a")
    ids = queue.enqueue_many([fair.job(i) for i in range(5)])
    other = queue.enqueue(app.with_options(queue="other", fairness_key="a").job(9))
    drain(queue, queues=("default", "other"))
    statuses = [job.status.value for job in map(queue.get_job, ids) if job is not None]
    assert statuses == ["queued"] * 5
    done = queue.get_job(other)
    assert done is not None and done.status.value == "succeeded"
    queue.resume_queue("default")
    drain(queue)
    statuses = [job.status.value for job in map(queue.get_job, ids) if job is not None]
    assert statuses == ["succeeded"] * 5


def test_fair_jobs_of_a_workflow_are_stamped_and_run_after_what_they_wait_for(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    from pgqueue import chain

    fair = app.with_options(fairness_key="tenant:1")
    flow = queue.enqueue_workflow(chain(fair.job(1), fair.job(2), fair.job(3)))
    vtimes = db.execute(
        f'SELECT vtime, status FROM "{schema}".jobs WHERE workflow_id = %s ORDER BY id',
        [flow.id],
    ).fetchall()
    assert vtimes == [(0.0, "queued"), (1.0, "blocked"), (2.0, "blocked")]
    drain(queue, concurrency=2)
    done = queue.get_workflow(flow.id)
    assert done is not None and {job.status.value for job in done.jobs} == {"succeeded"}


def test_jobs_a_worker_enqueues_itself_are_stamped_too(
    queue: Queue, app: Any, db: Any, schema: str, dsn: str
) -> None:
    """Recurring ticks and rescue follow-ups go through JobsStore.insert_jobs."""
    import asyncio

    from pgqueue.store.jobs import JobsStore

    queue.enqueue_many([app.with_options(fairness_key="a").job(i) for i in range(3)])

    async def insert() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            jobs = [app.with_options(fairness_key="a").job(9), app.job(10)]
            return [int(i) for i in await JobsStore(schema).insert_jobs(conn, jobs)]

    fair_id, plain_id = asyncio.run(insert())
    rows = db.execute(
        f'SELECT id, vtime FROM "{schema}".jobs WHERE id = ANY(%s) ORDER BY id',
        [[fair_id, plain_id]],
    ).fetchall()
    assert rows == [(fair_id, 3.0), (plain_id, None)]


def test_a_deduplicated_fair_job_is_stored_once_with_its_vtime(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    fair = app.with_options(fairness_key="a", dedupe_key="once")
    first = queue.enqueue(fair.job(1))
    again = queue.enqueue(fair.job(2))
    assert first.created and not again.created and int(again) == int(first)
    rows = db.execute(f'SELECT vtime FROM "{schema}".jobs WHERE fairness_key = %s', ["a"])
    assert rows.fetchall() == [(0.0,)]


def test_the_queue_clock_only_grows_its_log_and_the_sweep_keeps_its_top(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    """Claims never update a clock row in place (a long transaction would leave every reader
    walking its dead versions): each claim past the clock logs the new value, the clock is
    the highest, and the sweep's prune leaves only that one."""
    queue.enqueue_many([app.with_options(fairness_key=f"k{i % 3}").job(i) for i in range(30)])
    top = None
    for _ in range(5):
        _, top = fair_claim(db, schema, top or (-32768, float("-inf")), limit=3)
    log = [r[0] for r in db.execute(f'SELECT vtime FROM "{schema}".fairness_clock_log').fetchall()]
    assert len(log) >= 4 and top is not None
    assert db.execute(f'SELECT "{schema}".fairness_clock(%s)', ["default"]).fetchone() == (
        max(log),
    )
    assert max(log) == top[1]
    db.execute(query("fairness_clock_prune", schema))
    assert db.execute(f'SELECT vtime FROM "{schema}".fairness_clock_log').fetchall() == [
        (max(log),)
    ]
    # A job enqueued now starts at the clock, and the next claim from the hint reaches it.
    late = queue.enqueue(app.with_options(fairness_key="new").job(99))
    assert db.execute(f'SELECT vtime FROM "{schema}".jobs WHERE id = %s', [late]).fetchone() == (
        max(log),
    )


def test_the_commit_time_catch_up_reads_its_job_by_id_whatever_plan_is_cached(
    queue: Queue, app: Any, db: Any, schema: str, dsn: str
) -> None:
    """The catch-up runs in a trigger, whose statements a long-lived connection plans once
    and caches. With the table's statistics taken when no fair job was queued, the generic
    plan of an update naming the job's status and vtime walked the fair claim index instead
    of the primary key: every entry behind the clock, which a long transaction keeps, at
    every fair job's commit. The catch-up reads and writes its job by id alone."""
    queue.enqueue_many([app.with_options(fairness_key="flood").job(i) for i in range(2000)])
    # Scans of the fair claim index this transaction has run so far.
    index_scans = f"SELECT pg_stat_get_xact_numscans('\"{schema}\".jobs_fair_claim_idx'::regclass)"
    with psycopg.connect(dsn) as held, psycopg.connect(dsn) as producer:
        held.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT 1")  # the long transaction: its snapshot keeps what is claimed
        top = None
        while True:
            claimed, top = fair_claim(db, schema, top or (-32768, float("-inf")), limit=500)
            if not claimed:
                break
        db.execute(f'ANALYZE "{schema}".jobs')  # no fair job queued when the figures are taken
        producer.execute("SET plan_cache_mode = force_generic_plan")
        producer.commit()
        late = [
            queue.enqueue(app.with_options(fairness_key=f"quiet-{i}").job(i), conn=producer)
            for i in range(3)
        ]
        before = producer.execute(index_scans).fetchone()
        producer.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the catch-ups run now, counted
        after = producer.execute(index_scans).fetchone()
        producer.commit()
        held.rollback()
    assert before is not None and after is not None
    # The claims left 2,000 entries behind the clock; the catch-ups, by id, walk none of them.
    assert after[0] == before[0], "the catch-up scanned the fair claim index"
    clock = db.execute(f'SELECT "{schema}".fairness_clock(%s)', ["default"]).fetchone()
    stamps = db.execute(
        f'SELECT vtime FROM "{schema}".jobs WHERE id = ANY(%s)', [[job.id for job in late]]
    ).fetchall()
    assert len(stamps) == 3 and all(vtime >= clock[0] for (vtime,) in stamps)
