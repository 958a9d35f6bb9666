"""Per-key concurrency limits: admission, parking, giving slots back, the sweep, bad input.

The claim admits a keyed job only through its key's slot row; every way out of 'running'
gives the slot back (a trigger) and un-parks the key's next waiting job. The multi-process
proof that the limit holds is in test_tenants_processes.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgqueue import ConfigurationError, Queue
from pgqueue.queries import query
from pgqueue.store.jobs import finish_rows_params
from pgqueue.testing import drain
from tests.conftest import claim_params, listen_for_wakes, wait_until

# Run on each server CI tests against: tenant slots are the server's row locks.
pytestmark = pytest.mark.each_server


def claim(
    conn: psycopg.Connection[Any], schema: str, limit: int = 100, worker_id: int = 1
) -> tuple[list[int], list[int]]:
    """One job_claim of the default queue: (ids to run, ids parked)."""
    params = claim_params(limit=limit, worker_id=worker_id)
    rows = conn.execute(query("job_claim", schema), params).fetchall()
    return [r[0] for r in rows if not r[8]], [r[0] for r in rows if r[8]]


def finish(
    conn: psycopg.Connection[Any], schema: str, ids: list[int], status: str = "succeeded"
) -> None:
    outcomes = [
        {
            "id": i,
            "attempt": 1,
            "worker_id": 1,
            "status": status,
            "error": None if status == "succeeded" else {"error": "x"},
            "result": None,
            "duration": 0.01,
            "retry_in": 0 if status == "retry" else None,
        }
        for i in ids
    ]
    params = finish_rows_params(outcomes)
    conn.execute(query("job_finish_many", schema), params)


def statuses(conn: psycopg.Connection[Any], schema: str) -> dict[int, str]:
    rows = conn.execute(f'SELECT id, status FROM "{schema}".jobs ORDER BY id').fetchall()
    return dict(rows)


def slots(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    rows = conn.execute(f'SELECT key, running FROM "{schema}".concurrency_slots').fetchall()
    return dict(rows)


def test_claim_admits_up_to_each_limit_and_parks_the_rest(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("a", 2)
    queue.set_concurrency_limit(None, 3)  # the default, for "b"
    a = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(5)])
    free = queue.enqueue_many([app.job(i) for i in range(4)])
    b = queue.enqueue_many([app.with_options(concurrency_key="b").job(i) for i in range(5)])
    run, parked = claim(db, schema)
    assert sorted(run) == a[:2] + free + b[:3]
    assert sorted(parked) == a[2:] + b[3:]
    assert slots(db, schema) == {"a": 2, "b": 3}
    assert {statuses(db, schema)[i] for i in parked} == {"waiting"}
    job = queue.get_job(a[4])
    assert job is not None and job.status == "waiting"
    # Nothing is left to claim: parked jobs are out of the claim index.
    assert claim(db, schema) == ([], [])


def test_each_finished_job_gives_its_slot_to_the_next_waiting_job_of_its_key(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("a", 1)
    ids = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(3)])
    run, parked = claim(db, schema)
    assert (run, parked) == ([ids[0]], ids[1:])
    with psycopg.connect(queue.dsn or "", autocommit=True) as listener:
        listen_for_wakes(listener, queue.schema)
        finish(db, schema, run)
        notes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert notes == [f"default 0 {ids[1]}"]  # the un-parked job is announced, like an insert
    assert statuses(db, schema) == {ids[1]: "queued", ids[2]: "waiting"}
    assert slots(db, schema) == {"a": 0}
    assert claim(db, schema) == ([ids[1]], [])
    row = db.execute(
        f'SELECT concurrency_key FROM "{schema}".job_history WHERE id = %s', [ids[0]]
    ).fetchone()
    assert row == ("a",)


@pytest.mark.parametrize("way_out", ["failed", "retry", "release", "delete"])
def test_every_way_out_of_running_gives_the_slot_back(
    queue: Queue, app: Any, db: Any, schema: str, way_out: str
) -> None:
    queue.set_concurrency_limit("a", 1)
    ids = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(2)])
    run, _ = claim(db, schema)
    if way_out in ("failed", "retry"):
        finish(db, schema, run, way_out)
    elif way_out == "release":
        db.execute(query("job_release_many", schema), {"ids": run, "worker_id": 1})
    else:
        db.execute(f'DELETE FROM "{schema}".jobs WHERE id = %s', run)
    assert slots(db, schema) == {"a": 0}
    assert statuses(db, schema)[ids[1]] == "queued"


def test_a_paused_key_runs_nothing_until_its_limit_is_raised(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("a", 0)
    ids = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(3)])
    assert claim(db, schema) == ([], ids)
    queue.set_concurrency_limit("a", 2)  # un-parks up to the new room at once
    assert [s for s in statuses(db, schema).values()].count("queued") == 2
    run, parked = claim(db, schema)
    assert (run, parked) == (ids[:2], [])
    queue.set_concurrency_limit("a", None)  # removed, and no default: unlimited
    assert [x.key for x in queue.concurrency_limits()] == ["a"]  # still listed: it runs jobs
    finish(db, schema, run[:1])
    assert claim(db, schema) == ([ids[2]], [])


def test_limits_are_listed_with_their_running_and_waiting_jobs(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit(None, 1)
    queue.set_concurrency_limit("z", 5)
    queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(3)])
    claim(db, schema)
    listed = [(x.key, x.max_running, x.running, x.waiting) for x in queue.concurrency_limits()]
    assert listed == [("*", 1, 0, 0), ("a", None, 1, 2), ("z", 5, 0, 0)]


def test_a_finish_waiting_on_a_claims_slot_lock_unparks_what_that_claim_parked(
    dsn: str, queue: Queue, app: Any, db: Any, schema: str
) -> None:
    """The race the trigger's design rests on: a claim holds key a's slot row and parks a job
    because the key is full; a finish of a's running job waits for that row. After the claim
    commits, the finish's un-park (a later statement, a new snapshot) must see the parked job,
    or it would wait for the sweep while the key has room."""
    queue.set_concurrency_limit("a", 1)
    first = queue.enqueue(app.job(0), concurrency_key="a")
    (running,), _ = claim(db, schema)
    second = queue.enqueue(app.job(1), concurrency_key="a")
    with psycopg.connect(dsn) as claimer:  # a transaction, held open
        assert claim(claimer, schema) == ([], [second])
        done = threading.Event()

        def finish_first() -> None:
            with psycopg.connect(dsn, autocommit=True, application_name="finisher") as c:
                finish(c, schema, [first])
            done.set()

        thread = threading.Thread(target=finish_first)
        thread.start()

        def finisher_waits_on_a_lock() -> bool:
            row = db.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE application_name = 'finisher'"
            ).fetchone()
            return row is not None and row[0] == "Lock"

        wait_until(finisher_waits_on_a_lock, what="the finish to wait on the slot row")
        assert not done.is_set()
        claimer.commit()
        thread.join(timeout=30)
    assert done.is_set() and running == first
    assert statuses(db, schema) == {second: "queued"}
    assert slots(db, schema) == {"a": 0}


def test_the_sweep_corrects_a_drifted_counter_and_unparks_waiting_jobs(
    queue: Queue, app: Any, db: Any, schema: str, caplog: Any
) -> None:
    import asyncio

    from pgqueue.store import concurrency

    queue.set_concurrency_limit("a", 1)
    ids = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(3)])
    run, _ = claim(db, schema)
    db.execute(f'ALTER TABLE "{schema}".jobs DISABLE TRIGGER USER')  # a hand edit: no release
    db.execute(f'DELETE FROM "{schema}".jobs WHERE id = %s', run)
    db.execute(f'ALTER TABLE "{schema}".jobs ENABLE TRIGGER USER')
    assert slots(db, schema) == {"a": 1}

    async def sweep() -> int:
        async with await psycopg.AsyncConnection.connect(queue.dsn or "", autocommit=True) as c:
            return await concurrency.sweep(c, schema)

    assert asyncio.run(sweep()) == 1
    assert slots(db, schema) == {"a": 0}
    assert "counted 1 running jobs but has 0" in caplog.text
    assert statuses(db, schema) == {ids[1]: "queued", ids[2]: "waiting"}
    assert asyncio.run(sweep()) == 0  # a queued job of the key is the claim's to admit


def test_a_worker_runs_every_keyed_job_once_within_each_limit(queue: Queue, dsn: str) -> None:
    limits = {"a": 1, "b": 2, "c": 3}
    queue.set_concurrency_limit(None, 2)  # for "d"
    lock = threading.Lock()
    now: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    ran: Counter[int] = Counter()

    @queue.task(name="keyed")
    def keyed(i: int, key: str) -> None:
        with lock:
            now[key] += 1
            peak[key] = max(peak[key], now[key])
            ran[i] += 1
        time.sleep(0.005)  # the handler's work: lets jobs of one key overlap if allowed
        with lock:
            now[key] -= 1

    for key, n in limits.items():
        queue.set_concurrency_limit(key, n)
    keys = ["a", "b", "c", "d"]
    jobs = [keyed.with_options(concurrency_key=keys[i % 4]).job(i, keys[i % 4]) for i in range(400)]
    queue.enqueue_many(jobs)
    drain(queue, concurrency=16, batch_size=20)
    assert ran == Counter(range(400))
    assert peak == {"a": 1, "b": 2, "c": 3, "d": 2}  # reached, never passed


def test_atomic_tasks_and_bad_keys_or_limits_are_refused_clearly(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match="atomic and cannot take concurrency_key='a'"):

        @queue.task(name="at", atomic=True, concurrency_key="a")
        async def at() -> None: ...

    @queue.task(name="at2", atomic=True)
    async def at2() -> None: ...

    with pytest.raises(ConfigurationError, match="atomic and cannot take"):
        queue.enqueue(at2.job(), concurrency_key="a")
    for bad in ["*", "", "x" * 256, "a\x00b"]:
        with pytest.raises(ConfigurationError, match="concurrency"):
            queue.enqueue("at2", concurrency_key=bad)
        if bad != "*":
            with pytest.raises(ConfigurationError, match="invalid concurrency key"):
                queue.set_concurrency_limit(bad, 1)
    for limit in [-1, 1.5, True]:
        with pytest.raises(ConfigurationError, match=f"max_running={limit!r}"):
            queue.set_concurrency_limit("a", limit)  # type: ignore[arg-type]


def test_a_waiting_job_can_be_cancelled_and_a_retry_keeps_its_key(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("a", 1)
    ids = queue.enqueue_many([app.with_options(concurrency_key="a").job(i) for i in range(2)])
    run, parked = claim(db, schema)
    assert (run, parked) == (ids[:1], ids[1:])
    queue.cancel_job(ids[1])
    cancelled = queue.get_job(ids[1])
    assert cancelled is not None and cancelled.status == "cancelled"
    finish(db, schema, run, "failed")
    retry = queue.retry_job(ids[0])
    row = db.execute(
        f'SELECT concurrency_key, status FROM "{schema}".jobs WHERE id = %s', [retry]
    ).fetchone()
    assert row == ("a", "queued")
    keys = db.execute(
        f'SELECT id, concurrency_key FROM "{schema}".job_history ORDER BY id'
    ).fetchall()
    assert keys == [(ids[0], "a"), (ids[1], "a")]
