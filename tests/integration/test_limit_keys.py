"""Several limit keys per job: a job starts only when every one of its keys has room.

The claim admits through concurrency_admit (migration 0029), which takes the slot rows of
all the batch's keys in key order and admits jobs in claim order; a job that does not fit
waits on the first full key it met, and that key's release un-parks it. Templates on the
task make the keys from each job's arguments. The multi-process proof under kill -9 is in
test_limit_keys_processes.py.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgqueue import ConfigurationError, InvalidArgumentsError, Queue
from pgqueue.testing import drain
from tests.apps import tasks as apps
from tests.integration.test_job_rate_limits import T0, M, _claim
from tests.integration.test_tenants import claim, finish, slots, statuses

# Run on each server CI tests against: limit keys are the server's row locks.
pytestmark = pytest.mark.each_server


def stored_keys(db: Any, schema: str, job_id: int) -> tuple[str | None, list[str] | None]:
    row = db.execute(
        f'SELECT concurrency_key, limit_keys FROM "{schema}".jobs WHERE id = %s', [job_id]
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_job_starts_only_when_every_one_of_its_keys_has_room(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("tenant:1", 2)
    queue.set_concurrency_limit("user:1", 1)
    user1 = app.with_options(limits=["tenant:1", "user:1"])
    user2 = app.with_options(limits=["tenant:1", "user:2"])
    ids = queue.enqueue_many([user1.job(0), user1.job(1), user2.job(2), user2.job(3)])
    run, parked = claim(db, schema)
    # user:1 admits one; tenant:1 (limit 2) has room for one more, user:2's first job.
    assert (run, parked) == ([ids[0], ids[2]], [ids[1], ids[3]])
    assert slots(db, schema) == {"tenant:1": 2, "user:1": 1, "user:2": 1}
    waiting_on = dict(
        db.execute(
            f'SELECT id, waiting_on FROM "{schema}".jobs WHERE status = %s', ["waiting"]
        ).fetchall()
    )
    assert waiting_on == {ids[1]: "user:1", ids[3]: "tenant:1"}
    # The user:2 job frees tenant:1 and user:2: ids[3] waits on tenant:1 and comes back.
    finish(db, schema, [ids[2]])
    assert statuses(db, schema)[ids[3]] == "queued"
    assert statuses(db, schema)[ids[1]] == "waiting"  # user:1 is still full
    assert claim(db, schema) == ([ids[3]], [])
    finish(db, schema, [ids[0], ids[3]])
    assert claim(db, schema) == ([ids[1]], [])
    finish(db, schema, [ids[1]])
    assert slots(db, schema) == {"tenant:1": 0, "user:1": 0, "user:2": 0}


def test_the_concurrency_key_is_one_key_of_the_list(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit("a", 1)
    both = app.with_options(concurrency_key="a", limits=["b", "a"])
    ids = queue.enqueue_many([both.job(0), app.with_options(concurrency_key="a").job(1)])
    assert stored_keys(db, schema, ids[0]) == ("a", ["b"])  # "a" is not stored twice
    assert stored_keys(db, schema, ids[1]) == ("a", None)
    run, parked = claim(db, schema)
    assert (run, parked) == ([ids[0]], [ids[1]])  # both count on "a"
    assert slots(db, schema) == {"a": 1, "b": 1}


def test_a_job_with_several_keys_waits_without_holding_the_others(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    """A job parked on a full key takes nothing from its other keys: their jobs still run."""
    queue.set_concurrency_limit("full", 0)
    queue.set_concurrency_limit("shared", 1)
    blocked = queue.enqueue(app.with_options(limits=["full", "shared"]).job(0))
    other = queue.enqueue(app.with_options(limits=["shared"]).job(1))
    assert claim(db, schema) == ([other], [blocked])
    assert slots(db, schema) == {"full": 0, "shared": 1}


def test_every_way_out_of_running_gives_every_slot_back(
    queue: Queue, app: Any, db: Any, schema: str
) -> None:
    queue.set_concurrency_limit(None, 1)
    keyed = app.with_options(concurrency_key="a", limits=["b", "c"])
    ids = queue.enqueue_many([keyed.job(i) for i in range(4)])
    for way_out in ("failed", "retry", "delete"):
        run, _ = claim(db, schema)
        assert len(run) == 1
        if way_out == "delete":
            db.execute(f'DELETE FROM "{schema}".jobs WHERE id = %s', run)
        else:
            finish(db, schema, run, way_out)
        assert slots(db, schema) == {"a": 0, "b": 0, "c": 0}
    assert sum(s == "queued" for s in statuses(db, schema).values()) >= 1
    assert len(ids) == 4


def test_templates_make_the_keys_from_each_jobs_arguments(
    queue: Queue, db: Any, schema: str
) -> None:
    @queue.task(name="report", limits=["tenant:{tenant_id}", "user:{tenant_id}:{user_id}"])
    def report(tenant_id: int, user_id: int, title: str = "") -> None: ...

    first = report.enqueue(42, 7)
    assert stored_keys(db, schema, first) == (None, ["tenant:42", "user:42:7"])
    second = queue.enqueue(report.job(tenant_id=5, user_id=1, title="x"))
    assert stored_keys(db, schema, second) == (None, ["tenant:5", "user:5:1"])
    # Given at enqueue, the keys replace the task's, templates filled from the same job.
    third = queue.enqueue(report.job(1, 2), limits=["user:{user_id}"])
    assert stored_keys(db, schema, third) == (None, ["user:2"])
    fourth = report.with_options(limits=["literal"]).enqueue(1, 2)
    assert stored_keys(db, schema, fourth) == (None, ["literal"])


def test_template_errors_name_the_template_and_the_argument(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match=r"names 'tenant', which is not a parameter"):

        @queue.task(name="bad", limits=["tenant:{tenant}"])
        def bad(tenant_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match="name the argument"):

        @queue.task(name="bad2", limits=["tenant:{}"])
        def bad2(tenant_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match="cannot be read"):

        @queue.task(name="bad3", limits=["tenant:{tenant_id"])
        def bad3(tenant_id: int) -> None: ...

    @queue.task(name="ok")
    def ok(tenant_id: int, name: str = "") -> None: ...

    with pytest.raises(InvalidArgumentsError, match=r"'user:\{user_id\}' needs the argument"):
        ok.with_options(limits=["user:{user_id}"]).job(1)
    with pytest.raises(InvalidArgumentsError, match="not a valid key"):
        ok.with_options(limits=["{name}"]).job(1, "*")


def test_atomic_tasks_refuse_limits_and_bad_keys_are_refused(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match=r"atomic and cannot take limits=\['a'\]"):

        @queue.task(name="at", atomic=True, limits=["a"])
        async def at() -> None: ...

    @queue.task(name="at2", atomic=True)
    async def at2() -> None: ...

    with pytest.raises(ConfigurationError, match="atomic and cannot take limits"):
        queue.enqueue(at2.job(), limits=["a", "b"])
    for bad in (["*"], [""], ["x" * 256], [f"k{i}" for i in range(17)]):
        with pytest.raises(ConfigurationError, match="limits are up to 16 keys"):
            queue.enqueue("at2", limits=bad)


def test_a_worker_runs_every_job_once_within_the_limits_of_all_its_keys(
    queue: Queue, dsn: str
) -> None:
    limits = {"t0": 3, "t1": 2, "u0": 1, "u1": 2, "u2": 1}
    lock = threading.Lock()
    now: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    ran: Counter[int] = Counter()

    @queue.task(name="two_keys", limits=["{tenant}", "{user}"])
    def two_keys(i: int, tenant: str, user: str) -> None:
        with lock:
            for key in (tenant, user):
                now[key] += 1
                peak[key] = max(peak[key], now[key])
            ran[i] += 1
        time.sleep(0.005)  # the handler's work: lets jobs of one key overlap if allowed
        with lock:
            for key in (tenant, user):
                now[key] -= 1

    for key, n in limits.items():
        queue.set_concurrency_limit(key, n)
    queue.enqueue_many([two_keys.job(i, f"t{i % 2}", f"u{i % 3}") for i in range(300)])
    drain(queue, concurrency=16, batch_size=20)
    assert ran == Counter(range(300))
    assert all(peak[k] <= n for k, n in limits.items()), peak
    assert peak["t0"] >= 2 and peak["u1"] == 2  # limits were reached, so they were tested


def test_each_key_of_a_job_applies_its_own_rate_limit(queue: Queue, dsn: str, schema: str) -> None:
    queue.set_key_rate_limit("tenant:1", 3, per=5)
    queue.set_key_rate_limit("user:2", 1, per=5)
    for user in (1, 2, 2, 1, 1):
        queue.enqueue(apps.noop.with_options(queue="q", limits=["tenant:1", f"user:{user}"]).job())
    queue.enqueue(apps.noop.with_options(queue="q", limits=["tenant:2"]).job())  # no limit
    claimed, _, back_in = _claim(dsn, schema, "q", 20, T0)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT status FROM "{schema}".jobs ORDER BY id').fetchall()
    # user:2 starts once; tenant:1 three times: its first user:1 job, then user:2, user:1.
    assert [r[0] for r in rows] == [
        "running",
        "running",
        "scheduled",  # user:2 is full
        "running",
        "scheduled",  # tenant:1 is full
        "running",
    ]
    assert len(claimed.jobs) == 4 and back_in == pytest.approx(5 + M)


def test_a_retry_keeps_its_jobs_limit_keys_and_fairness_key_and_records_show_them(
    queue: Queue, db: Any, schema: str
) -> None:
    @queue.task(name="flaky", max_attempts=1, fairness_key="{tenant}")
    def flaky(tenant: str) -> None:
        raise RuntimeError("down")

    queue.set_concurrency_limit("user:7", 1)
    job_id = flaky.with_options(limits=["tenant:acme", "user:7"]).enqueue("acme")
    live = queue.get_job(job_id)
    assert live is not None
    assert (live.limit_keys, live.fairness_key) == (["tenant:acme", "user:7"], "acme")
    drain(queue)
    failed = queue.get_job(job_id)
    assert failed is not None and failed.status.value == "failed"
    assert (failed.limit_keys, failed.fairness_key) == (["tenant:acme", "user:7"], "acme")
    # A job holding user:7 (limit 1) first, so the retry's limits must hold it back.
    blocker = queue.task(name="blocker")(lambda: None)
    first = int(blocker.with_options(limits=["user:7"]).enqueue())
    assert claim(db, schema)[0] == [first]
    retried = int(queue.retry_job(job_id))
    _, keys = stored_keys(db, schema, retried)
    assert keys == ["tenant:acme", "user:7"]
    row = db.execute(
        f'SELECT fairness_key, vtime IS NOT NULL FROM "{schema}".jobs WHERE id = %s', [retried]
    ).fetchone()
    assert row == ("acme", True)  # a fair job again, stamped on its key's clock
    drain(queue)
    waiting = db.execute(
        f'SELECT status, waiting_on FROM "{schema}".jobs WHERE id = %s', [retried]
    ).fetchone()
    assert waiting == ("waiting", "user:7")
    finish(db, schema, [first])
    drain(queue)
    again = queue.get_job(retried)
    assert again is not None and again.status.value == "failed" and again.attempt == 1
    plain = queue.get_job(first)
    assert plain is not None and plain.fairness_key is None and plain.limit_keys == ["user:7"]
