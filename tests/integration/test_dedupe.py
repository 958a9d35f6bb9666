"""Dedupe keys: one live job per key, and every caller gets its id, however they race."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import AsyncQueue, ConfigurationError, Enqueued, Queue
from pgqueue.queries import query
from pgqueue.testing import drain
from tests.conftest import ROOT, count, listen_for_wakes, worker_process

# Run on each server CI tests against: dedupe rests on the server's unique indexes.
pytestmark = pytest.mark.each_server


@pytest.fixture
def noop(queue: Queue) -> Any:
    return queue.task(name="noop")(lambda: None)


def test_a_live_job_with_the_key_is_returned_and_nothing_is_inserted(
    queue: Queue, noop: Any, conn: psycopg.Connection[Any], schema: str
) -> None:
    first = queue.enqueue(noop.job(), conn=conn, dedupe_key="report:42")
    second = queue.enqueue(noop.job(), conn=conn, dedupe_key="report:42")
    other = queue.enqueue(noop.job(), conn=conn, dedupe_key="report:43")
    assert isinstance(first, Enqueued) and first.created
    assert second == first and not second.created
    assert other != first and other.created
    assert count(conn, schema, "jobs") == 2


def test_without_a_window_a_finished_job_does_not_count(queue: Queue, noop: Any, dsn: str) -> None:
    first = noop.with_options(dedupe_key="k").enqueue()
    drain(queue)
    again = noop.with_options(dedupe_key="k").enqueue()
    assert again.created and again != first


def test_within_the_window_a_finished_job_counts_and_after_it_does_not(
    queue: Queue, noop: Any, conn: psycopg.Connection[Any], schema: str
) -> None:
    first = noop.with_options(dedupe_key="k", dedupe_window=600).enqueue()
    drain(queue)
    again = queue.enqueue(noop.job(), conn=conn, dedupe_key="k", dedupe_window=600)
    assert again == first and not again.created
    conn.execute(
        f"UPDATE \"{schema}\".job_history SET finished_at = finished_at - interval '11 minutes'"
    )
    later = queue.enqueue(noop.job(), conn=conn, dedupe_key="k", dedupe_window=600)
    assert later.created and later != first


def test_a_task_default_window_applies_to_keyed_jobs(queue: Queue) -> None:
    report = queue.task(name="report", dedupe_window=600)(lambda n: n)
    first = report.with_options(dedupe_key="r1").enqueue(1)
    drain(queue)
    assert report.with_options(dedupe_key="r1").enqueue(1) == first


def test_a_batch_resolves_each_key_once_and_keeps_the_order(
    queue: Queue, noop: Any, conn: psycopg.Connection[Any], schema: str
) -> None:
    existing = queue.enqueue(noop.job(), conn=conn, dedupe_key="b")
    keyed = noop.with_options  # reads better below
    got = queue.enqueue_many(
        [
            keyed(dedupe_key="a").job(),
            noop.job(),
            keyed(dedupe_key="b").job(),
            keyed(dedupe_key="a").job(),
            noop.job(),
        ],
        conn=conn,
    )
    assert [g.created for g in got] == [True, True, False, False, True]
    assert got[0] == got[3] and got[2] == existing
    assert len(set(got)) == 4
    assert count(conn, schema, "jobs") == 4


def test_rolled_back_keyed_job_frees_the_key(
    queue: Queue, noop: Any, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        queue.enqueue(noop.job(), conn=conn, dedupe_key="k")
        conn.rollback()
        assert queue.enqueue(noop.job(), conn=conn, dedupe_key="k").created


def test_a_waiting_enqueue_gets_the_id_of_the_job_committed_meanwhile(
    queue: Queue, noop: Any, dsn: str
) -> None:
    """The second transaction blocks on the first's uncommitted row, then must see it."""
    import threading

    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        winner = queue.enqueue(noop.job(), conn=first, dedupe_key="k")
        result: list[Enqueued] = []
        waiter = threading.Thread(
            target=lambda: result.append(queue.enqueue(noop.job(), conn=second, dedupe_key="k"))
        )
        waiter.start()
        with psycopg.connect(dsn, autocommit=True) as probe:
            _wait_for_lock_wait(probe, second)
        first.commit()
        waiter.join(timeout=60)
        second.commit()
    assert result == [winner] and not result[0].created


def test_a_waiting_enqueue_inserts_when_the_other_rolls_back(
    queue: Queue, noop: Any, dsn: str, schema: str
) -> None:
    import threading

    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        loser = queue.enqueue(noop.job(), conn=first, dedupe_key="k")
        result: list[Enqueued] = []
        waiter = threading.Thread(
            target=lambda: result.append(queue.enqueue(noop.job(), conn=second, dedupe_key="k"))
        )
        waiter.start()
        with psycopg.connect(dsn, autocommit=True) as probe:
            _wait_for_lock_wait(probe, second)
        first.rollback()
        waiter.join(timeout=60)
        second.commit()
        assert result[0].created and result[0] != loser
        assert count(second, schema, "jobs") == 1


def _wait_for_lock_wait(probe: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> None:
    from tests.conftest import wait_until

    pid = conn.info.backend_pid

    def waiting() -> bool:
        row = probe.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        return row is not None and row[0] == "Lock"

    wait_until(waiting, what="the second enqueue to wait on the first's row")


def test_a_bad_dedupe_key_or_window_is_refused_naming_it(queue: Queue, noop: Any) -> None:
    with pytest.raises(ConfigurationError, match="dedupe_key"):
        noop.with_options(dedupe_key="x" * 513)
    with pytest.raises(ConfigurationError, match="dedupe_window"):
        noop.with_options(dedupe_key="k", dedupe_window=-5)


def test_async_twin_deduplicates_too(dsn: str, schema: str) -> None:
    import asyncio

    async def main() -> list[Enqueued]:
        aqueue = AsyncQueue(dsn, schema=schema)
        t = aqueue.task(name="noop")(lambda: None)
        try:
            one = await t.with_options(dedupe_key="k").enqueue()
            two = await aqueue.enqueue("noop", dedupe_key="k")
            return [one, two]
        finally:
            await aqueue.close()

    one, two = asyncio.run(main())
    assert one == two and one.created and not two.created


def _race(dsn: str, schema: str, tmp_path: Path, *, window: float, rounds: int) -> list[Any]:
    """Start several enqueueing processes at once; return every job they were given."""
    go = tmp_path / "go"
    procs = []
    outs = []
    for n in range(4):
        out = tmp_path / f"client-{n}.jsonl"
        outs.append(out)
        args = [dsn, schema, str(out), str(go), "20", str(rounds), str(window), str(n)]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.apps.dedupe_client", *args],
                cwd=ROOT,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for out in outs for line in out.read_text().splitlines()]


def _jobs_per_key(dsn: str, schema: str) -> dict[str, list[int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f'SELECT dedupe_key, id FROM "{schema}".jobs WHERE dedupe_key IS NOT NULL '
            f'UNION ALL SELECT dedupe_key, id FROM "{schema}".job_history '
            "WHERE dedupe_key IS NOT NULL"
        ).fetchall()
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, job_id in rows:
        per_key[key].append(job_id)
    return per_key


def test_processes_racing_on_the_same_keys_get_one_job_per_key(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    given = _race(dsn, schema, tmp_path, window=0, rounds=40)
    per_key = _jobs_per_key(dsn, schema)
    assert sorted(per_key) == sorted(f"k{k}" for k in range(20))
    assert all(len(ids) == 1 for ids in per_key.values()), per_key
    for line in given:
        assert line["id"] == per_key[line["key"]][0], line
    created = [line["key"] for line in given if line["created"]]
    assert sorted(created) == sorted(per_key), "exactly one caller created each key's job"


def test_with_a_window_and_a_worker_finishing_jobs_meanwhile_each_key_runs_once(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Jobs finish (move to history) while the enqueuers race: with a long window, the
    finished job still counts, so each key gets exactly one job in all."""
    log = tmp_path / "worker.log"
    worker = worker_process(dsn, schema, "--concurrency", "4", log=log)
    try:
        given = _race(dsn, schema, tmp_path, window=3600, rounds=40)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    per_key = _jobs_per_key(dsn, schema)
    assert all(len(ids) == 1 for ids in per_key.values()), per_key
    for line in given:
        assert line["id"] == per_key[line["key"]][0], line
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "job_history") > 0, "the worker finished nothing: no race"


def test_key_lookups_probe_the_key_indexes(
    queue: Queue, noop: Any, conn: psycopg.Connection[Any], schema: str
) -> None:
    """Each key is one index probe in the live table and one in history, never a scan."""
    queue.enqueue_many(
        [noop.with_options(dedupe_key=f"k{n}").job() for n in range(2000)], conn=conn
    )
    conn.commit()
    jobs = [noop.with_options(dedupe_key=f"k{n}", dedupe_window=60).job() for n in range(3)]
    params = {
        "jobs": json.dumps([job.as_row() | {"ord": n} for n, job in enumerate(jobs)]),
        "now": None,
        "trace_context": None,
    }
    statement = query("job_insert_unique", schema)
    rows = conn.execute(sql.SQL("EXPLAIN (COSTS OFF) ") + statement, params).fetchall()
    plan = "\n".join(row[0] for row in rows)
    assert "jobs_dedupe_key_idx" in plan, plan
    # History: each partition's own copy of job_history_dedupe_key_idx.
    history = [line for line in plan.splitlines() if " on job_history" in line]
    assert history and all("Index" in line and "dedupe_key" in line for line in history), plan
    assert "Seq Scan on jobs" not in plan, plan


def test_a_keyed_enqueue_wakes_workers_as_job_insert_does(
    queue: Queue, noop: Any, dsn: str
) -> None:
    """The payload names the lowest (priority, id) made claimable, one per queue, so a worker
    whose hint has passed it claims from there (job_insert's wake-up)."""
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as conn:
        listen_for_wakes(listener, queue.schema)
        plain = queue.enqueue(noop.job(), conn=conn, priority=5)
        keyed = queue.enqueue_many(
            [noop.with_options(dedupe_key=k, priority=p).job() for k, p in (("a", 3), ("b", -2))],
            conn=conn,
        )
        queue.enqueue(noop.job(), conn=conn, dedupe_key="a")  # nothing new: no lower position
        conn.commit()
        payloads = [note.payload for note in listener.notifies(timeout=2, stop_after=3)]
    assert payloads[0] == f"default 5 {plain}"
    assert f"default -2 {keyed[1]}" in payloads
    assert len(payloads) == 2, payloads


def test_an_idle_worker_is_woken_by_a_keyed_enqueue(queue: Queue, dsn: str) -> None:
    import threading

    from pgqueue import Worker
    from tests.conftest import wait_until, worker_in_thread

    ran = threading.Event()
    t = queue.task(name="t")(lambda: ran.set())
    worker = Worker(queue, dsn=dsn, poll_interval=600)
    with worker_in_thread(worker):
        wait_until(lambda: worker.stats.claims > 0, what="the first (empty) claim")
        t.with_options(dedupe_key="k").enqueue()
        assert ran.wait(30), "only the notification could start the job this soon"
