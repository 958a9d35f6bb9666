"""The safety net and the orphan look walk bounded ranges while a snapshot is held.

The safety net used to drop the hint and claim from the floor, walking every dead entry a
long transaction keeps in the claim index. It is now a sweep (pgqueue/worker/sweep.py): each
reset looks at one slice of the table's pages and claims the jobs it finds there at or before
the hint. The look for orphans reads the running jobs of the removed workers only (migration
0042), not every running entry. Walks are counted in buffers, never timed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plans import plan_nodes
from pgqueue import Queue
from pgqueue.queries import query
from pgqueue.worker import sweep as sweep_module
from tests.conftest import claimer_by_hand

# Run on each server CI tests against: TID range scans and the plans are the server's.
pytestmark = pytest.mark.each_server

FLOOR, CEILING = (-32768, 0), (32767, 2**63 - 1)


def _analysed(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> Any:
    """The plan of one run of `statement`, with its buffers, rolled back."""
    explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + statement
    with conn.transaction(force_rollback=True):
        row = conn.execute(explain, params).fetchone()
    assert row is not None
    return row[0][0]["Plan"]


def _read(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def _buffers(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> int:
    """Shared buffers one run of `statement` touched, rolled back."""
    return _read(_analysed(conn, statement, params))


def _jobs_buffers(conn: psycopg.Connection[Any], statement: Any, params: dict[str, Any]) -> int:
    """Shared buffers the plan's scans of the jobs table touched, rolled back: the statement's
    other reads, of the catalog among them, vary with what the cache lost to tests beside it."""
    plan = _analysed(conn, statement, params)
    found = [n for n in plan_nodes(plan) if n.get("Relation Name") == "jobs"]
    assert found, "no scan of the jobs table in the plan"
    return sum(_read(n) for n in found)


@contextmanager
def _held(dsn: str) -> Iterator[None]:
    """A REPEATABLE READ snapshot held idle: no dead row from now on can be removed."""
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT txid_current()")
        yield
        holder.rollback()


def _dead(conn: psycopg.Connection[Any], schema: str, n: int, **columns: Any) -> None:
    """n jobs of queue default at three priorities written, then deleted with every other job
    of that status and worker: dead rows and dead index entries under a held snapshot."""
    name = sql.Identifier(schema)
    status, worker = columns.get("status", "queued"), columns.get("worker_id")
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (queue, task, args, priority, status, worker_id, attempt)"
            " SELECT 'default', 't', '{{}}', (g %% 3) - 1, %s, %s, %s"
            " FROM generate_series(1, %s) AS g"
        ).format(name),
        [status, worker, 1 if worker else 0, n],
    )
    conn.execute(
        sql.SQL(
            "DELETE FROM {}.jobs WHERE queue = 'default' AND status = %s"
            " AND worker_id IS NOT DISTINCT FROM %s"
        ).format(name),
        [status, worker],
    )


def _claim_params(worker_id: int) -> dict[str, Any]:
    return {
        "queue": "default",
        "after_priority": FLOOR[0],
        "after_id": FLOOR[1],
        "before_priority": CEILING[0],
        "before_id": CEILING[1],
        "limit": 10,
        "worker_id": worker_id,
        "now": None,
        "limited_tasks": [],
    }


def test_a_slice_reads_its_pages_however_many_dead_rows_a_held_snapshot_keeps(
    dsn: str, schema: str, queue: Queue
) -> None:
    t = queue.task(name="t")(lambda: None)
    pages = 40
    find = query("job_sweep_find", schema)
    slice_params = {
        "queue": "default",
        "lo": "(0,0)",
        "hi": f"({pages},0)",
        "hint_priority": CEILING[0],
        "hint_id": CEILING[1],
        "limit": 100,
    }
    floor = query("job_claim_unkeyed", schema)
    found: list[tuple[int, int]] = []
    with _held(dsn), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # as the claim connection
        for _ in range(2):
            _dead(conn, schema, 10_000)
            queue.enqueue_many([t.job() for _ in range(10)], conn=conn)  # the live end
            found.append(
                (_jobs_buffers(conn, find, slice_params), _buffers(conn, floor, _claim_params(0)))
            )
    (slice_1, floor_1), (slice_2, floor_2) = found
    # A slice reads its own pages...
    assert slice_1 <= pages + 2 and slice_2 <= pages + 2, found
    # ...while the claim from the floor walks every dead entry: the control.
    assert floor_2 > floor_1 + 50, found


@pytest.mark.parametrize("priority", [0, -1], ids=["hint-priority", "more-urgent"])
def test_a_job_no_wake_up_names_is_found_by_the_sweep_within_one_cycle(
    dsn: str, schema: str, queue: Queue, monkeypatch: pytest.MonkeyPatch, priority: int
) -> None:
    # A job locked by another session while the claims pass it, then released: nothing
    # announces it. The resets' slices (shrunk to a few pages here) go round the table
    # and one of them finds it, at the hint's priority or a more urgent one, without a
    # claim from the floor.
    monkeypatch.setattr(sweep_module, "SWEEP_MIN_PAGES", 4)
    t = queue.task(name="t")(lambda: None)
    name = sql.Identifier(schema)

    async def scenario() -> tuple[int, int, int, list[int], int]:
        async with claimer_by_hand(dsn, schema, steady=False) as (claimer, conn):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args, status, run_at) SELECT 'other',"
                    " 't', '{{}}', 'scheduled', now() + interval '1 day'"
                    " FROM generate_series(1, 2000)"
                ).format(name)
            )
            lonely = queue.enqueue(t.job(), conn=conn, priority=priority)
            with psycopg.connect(dsn) as locker:
                locker.execute(
                    sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(name),
                    [lonely.id],
                )
                later = queue.enqueue(t.job(), conn=conn)
                got = [j.id for j in (await claimer.claim_round(10))[0]]  # from the floor
                assert got == [later.id]
            hint = claimer.hints["default"]
            unhinted = claimer.stats.unhinted_claims
            for _ in range(3):  # control: without a reset nothing finds it
                assert (await claimer.claim_round(10))[0] == []
            row = conn.execute(
                sql.SQL("SELECT (ctid::text::point)[0]::int FROM {}.jobs WHERE id = %s").format(
                    name
                ),
                [lonely.id],
            ).fetchone()
            assert row is not None
            page, spans, resets = row[0], [], 0
            sweep = claimer._sweeps["default"]
            while resets < 100:
                hint.deadline = 0.0  # the reset is due
                resets += 1
                at = sweep.at
                claimed = [j.id for j in (await claimer.claim_round(10))[0]]
                spans.append(sweep.hi - at)
                if claimed:
                    assert claimed == [lonely.id]
                    break
            return page, resets, claimer.stats.unhinted_claims - unhinted, spans, claimer.sweeps

    page, resets, floor_claims, spans, sweeps = asyncio.run(scenario())
    assert floor_claims == 0
    assert set(spans) == {4}  # each slice as wide as the least, the table not growing
    assert resets == page // 4 + 1 == sweeps  # the slice holding its page, the first time


def test_a_fair_slice_reads_its_pages_however_many_dead_fair_rows_a_held_snapshot_keeps(
    dsn: str, schema: str, queue: Queue
) -> None:
    """The fair claim's safety net reads one slice of pages, and claims a job it found with
    a walk that ends at that job; the fair claim from the floor, the control, walks every
    dead fair entry."""
    t = queue.task(name="t")(lambda: None)
    pages = 40
    name = sql.Identifier(schema)
    find = query("job_sweep_find_fair", schema)
    claim = query("job_claim_fair", schema)
    slice_params = {
        "queue": "default",
        "lo": "(0,0)",
        "hi": f"({pages},0)",
        "hint_priority": CEILING[0],
        "hint_vtime": float("inf"),
        "limit": 100,
    }

    def fair_claim(after: tuple[int, float], before: tuple[int, float]) -> dict[str, Any]:
        return {
            "queue": "default",
            "after_priority": after[0],
            "after_vtime": after[1],
            "before_priority": before[0],
            "before_vtime": before[1],
            "limit": 1,
            "worker_id": 0,
            "now": None,
        }

    found: list[tuple[int, int, int]] = []
    with _held(dsn), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # as the claim connection
        for _ in range(2):
            conn.execute(
                sql.SQL(
                    # below the clock, where the claims from the floor pass them
                    "INSERT INTO {}.jobs (queue, task, args, priority, vtime, fairness_key)"
                    " SELECT 'default', 't', '{{}}', 0, -g, 'a' FROM generate_series(1, 10000) AS g"
                ).format(name)
            )
            conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE queue = 'default'").format(name))
            queue.enqueue_many(
                [t.with_options(fairness_key="a").job() for _ in range(10)], conn=conn
            )
            row = conn.execute(
                sql.SQL("SELECT min(vtime) FROM {}.jobs WHERE queue = 'default'").format(name)
            ).fetchone()
            assert row is not None
            at = (0, float(row[0]))
            floor = (FLOOR[0], float("-inf"))
            found.append(
                (
                    _jobs_buffers(conn, find, slice_params),
                    _buffers(conn, claim, fair_claim(at, at)),
                    _buffers(conn, claim, fair_claim(floor, (CEILING[0], float("inf")))),
                )
            )
    (slice_1, at_1, floor_1), (slice_2, at_2, floor_2) = found
    assert slice_1 <= pages + 2 and slice_2 <= pages + 2, found
    assert at_2 <= at_1 + 10, found  # the claim of a found job: one descent, flat
    assert floor_2 > floor_1 + 50, found  # the control


def test_the_fair_safety_net_finds_a_job_behind_its_hint_by_a_slice_not_the_floor(
    dsn: str, schema: str, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fair job locked by another session while the fair claim passes it, then released:
    # nothing announces it. The fair hint's resets look at slices of a few pages, keep the
    # hint, and one of them finds the job; no claim starts from the floor after the first.
    monkeypatch.setattr(sweep_module, "SWEEP_MIN_PAGES", 4)
    t = queue.task(name="t")(lambda: None)
    fair = t.with_options(fairness_key="a")
    name = sql.Identifier(schema)

    async def scenario() -> tuple[int, int, int, int]:
        async with claimer_by_hand(dsn, schema, steady=False) as (claimer, conn):
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args, status, run_at) SELECT 'other',"
                    " 't', '{{}}', 'scheduled', now() + interval '1 day'"
                    " FROM generate_series(1, 2000)"
                ).format(name)
            )
            lonely = queue.enqueue(fair.job(), conn=conn)
            with psycopg.connect(dsn) as locker:
                locker.execute(
                    sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(name),
                    [lonely.id],
                )
                later = queue.enqueue(fair.job(), conn=conn)
                got = [j.id for j in (await claimer.claim_round(10))[0]]  # from the floor
                assert got == [later.id]
                # The next fair claim walks the last one's range again: it passes the job too.
                assert (await claimer.claim_round(10))[0] == []
            assert "default" in claimer.controls.fair
            plain, hint = claimer.hints["default"], claimer._fair._hints["default"]
            plain.deadline = float("inf")  # the plain claim's own sweep is not this test's
            unhinted = claimer.stats.unhinted_claims
            for _ in range(3):  # control: without a reset nothing finds it
                assert (await claimer.claim_round(10))[0] == []
            row = conn.execute(
                sql.SQL("SELECT (ctid::text::point)[0]::int FROM {}.jobs WHERE id = %s").format(
                    name
                ),
                [lonely.id],
            ).fetchone()
            assert row is not None
            page, resets = row[0], 0
            while resets < 100:
                hint.deadline = 0.0  # the fair reset is due
                resets += 1
                claimed = [j.id for j in (await claimer.claim_round(10))[0]]
                if claimed:
                    assert claimed == [lonely.id]
                    break
                assert hint.after is not None  # the reset keeps the hint
            floor_claims = claimer.stats.unhinted_claims - unhinted
            return page, resets, floor_claims, claimer._fair.sweeps

    page, resets, floor_claims, sweeps = asyncio.run(scenario())
    assert floor_claims == 0
    assert resets == page // 4 + 1 == sweeps  # the slice holding its page, the first time


def test_the_orphan_look_reads_only_the_removed_workers_running_jobs(
    dsn: str, schema: str, queue: Queue
) -> None:
    name = sql.Identifier(schema)
    t = queue.task(name="t")(lambda: None)

    def worker(conn: psycopg.Connection[Any], label: str) -> int:
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
                " VALUES (%s, 'h', 1, '{{default}}', 1) RETURNING id"
            ).format(name),
            [label],
        ).fetchone()
        assert row is not None
        return int(row[0])

    orphaned = query("job_find_orphaned", schema)
    # The look as it was: every running entry, to show what the held snapshot keeps.
    every = sql.SQL(
        "SELECT j.id FROM {}.jobs AS j WHERE j.status = 'running' AND NOT EXISTS"
        " (SELECT 1 FROM {}.workers AS w WHERE w.id = j.worker_id) ORDER BY j.id LIMIT 1000"
    ).format(name, name)
    with _held(dsn), psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")
        alive = worker(conn, "alive")
        _dead(conn, schema, 10_000, status="running", worker_id=alive)
        vanished = worker(conn, "vanished")
        job = queue.enqueue(t.job(), conn=conn)
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s WHERE id = %s"
            ).format(name),
            [vanished, job.id],
        )
        conn.execute(sql.SQL("DELETE FROM {}.workers WHERE id = %s").format(name), [vanished])
        rows = conn.execute(orphaned, {"limit": 1000}).fetchall()
        walked = _buffers(conn, orphaned, {"limit": 1000})
        control = _buffers(conn, every, {})
    assert [r[0] for r in rows] == [job.id]
    assert walked < 30, walked
    assert control > 100, control


def test_removed_workers_are_forgotten_once_back_or_long_gone_with_nothing_running(
    dsn: str, schema: str, queue: Queue
) -> None:
    name = sql.Identifier(schema)
    t = queue.task(name="t")(lambda: None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                sql.SQL(
                    "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
                    " SELECT 'w' || g, 'h', 1, '{{default}}', 1 FROM generate_series(1, 4) AS g"
                    " RETURNING id"
                ).format(name)
            ).fetchall()
        ]
        back, idle, busy, recent = ids
        job = queue.enqueue(t.job(), conn=conn)
        conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET status = 'running', attempt = 1, worker_id = %s WHERE id = %s"
            ).format(name),
            [busy, job.id],
        )
        conn.execute(sql.SQL("DELETE FROM {}.workers").format(name))
        conn.execute(
            sql.SQL(
                "UPDATE {}.workers_removed SET removed_at = now() - interval '1 hour'"
                " WHERE id <> %s"
            ).format(name),
            [recent],
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (id, name, hostname, pid, queues, concurrency)"
                " OVERRIDING SYSTEM VALUE VALUES (%s, 'back', 'h', 1, '{{default}}', 1)"
            ).format(name),
            [back],
        )
        conn.execute(query("worker_removed_prune", schema), {"lease": 60.0, "now": None})
        left = conn.execute(
            sql.SQL("SELECT id FROM {}.workers_removed ORDER BY id").format(name)
        ).fetchall()
    # The worker back and the one long gone with nothing running are forgotten; the one
    # with a job still running, and the one removed within the lease, are kept.
    assert [r[0] for r in left] == sorted([busy, recent])
    assert idle not in [r[0] for r in left]


def test_a_plan_of_the_sweep_reads_pages_by_tid_range(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        params = {
            "queue": "default",
            "lo": "(0,0)",
            "hi": "(10,0)",
            "hint_priority": 0,
            "hint_id": 1,
            "limit": 100,
        }
        explain = sql.SQL("EXPLAIN (FORMAT JSON) ") + query("job_sweep_find", schema)
        row = conn.execute(explain, params).fetchone()
    assert row is not None
    assert "Tid Range Scan" in json.dumps(row[0]), json.dumps(row[0], indent=1)
