"""A worker that keeps up with a stream of jobs is not woken for each one (steady mode:
pgqueue/worker/loop.py, claimer.py; sql/migrations/0035_steady_wake.sql).

While jobs arrive at one or more per claim_cooldown, the worker claims every cooldown on its
own and its wake_listeners rows skip new jobs' wake-ups, so the applications' commits no
longer queue for PostgreSQL's notification lock. What it can no longer hear of is a job
committed late, below the hint of a claim that passed it: the claims' snapshots name the
transactions in progress, and the worker claims again from where it passed them once they
end. These tests run that race against a worker that cannot poll or reset its way out of it.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, Worker, wakeup
from pgqueue.queries import channel, query
from pgqueue.store.workers import WorkersStore
from pgqueue.wakeup import Position
from pgqueue.worker import claimer as claimer_module
from pgqueue.worker import hints as hints_module
from pgqueue.worker.interest import FIRST_CHECK, WakeInterest
from tests.apps import tasks as apps
from tests.conftest import (
    claimer_by_hand,
    clean_exit_logs,
    settings_worker_process,
    stop_worker_processes,
    wait_until,
    worker_in_thread,
)

# Run on each server CI tests against: wake-ups are the server's notifications.
pytestmark = [
    pytest.mark.each_server,
    # A stream from threads of this process must keep the worker steady: with other tests
    # beside it on two cores, the stream stalls and the worker leaves steady mode.
    pytest.mark.alone,
]

PRODUCERS = 8


def _steady_rows(conn: psycopg.Connection[Any], schema: str) -> int:
    """Workers whose row skips new priority-0 jobs' wake-ups only (steady, not busy)."""
    row = conn.execute(
        sql.SQL(
            "SELECT count(*) FROM {}.wake_listeners WHERE new_only AND below <= 0 AND 0 <= above"
        ).format(sql.Identifier(schema))
    ).fetchone()
    return int(row[0]) if row else 0


def _stream(
    dsn: str, queue: Queue, stop: threading.Event, counts: list[int], n: int, pause: float
) -> None:
    """Enqueue no-op jobs one per transaction on a connection of its own until `stop`."""
    with psycopg.connect(dsn, autocommit=True, application_name="steady producer") as conn:
        while not stop.is_set():
            queue.enqueue(apps.noop.job(), conn=conn)
            counts[n] += 1
            time.sleep(pause)


def _worker_row(watch: psycopg.Connection[Any], schema: str) -> None:
    """Wait for the worker process's row: it is claiming."""
    count = sql.SQL("SELECT count(*) FROM {}.workers").format(sql.Identifier(schema))
    wait_until(lambda: watch.execute(count).fetchone() == (1,), what="the worker's row")


def _start_stream(
    dsn: str, queue: Queue, stop: threading.Event, counts: list[int]
) -> list[threading.Thread]:
    """PRODUCERS threads, each enqueueing a job per millisecond or so until `stop`."""
    threads = [
        threading.Thread(target=_stream, args=(dsn, queue, stop, counts, n, 0.001))
        for n in range(PRODUCERS)
    ]
    for thread in threads:
        thread.start()
    return threads


def _end_stream(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for thread in threads:
        thread.join(30)


def _all_succeeded(watch: psycopg.Connection[Any], schema: str, total: int) -> None:
    """Wait for every job enqueued to have succeeded: none is lost, with no poll needed (the
    default poll is a second away, and the last jobs still come in at once)."""
    done = sql.SQL("SELECT count(*) FROM {}.job_history WHERE status = 'succeeded'").format(
        sql.Identifier(schema)
    )
    wait_until(
        lambda: watch.execute(done).fetchone() == (total,),
        timeout=30,
        what="every job to finish",
    )


@pytest.mark.parametrize("cooldown", [0.002, 0.0], ids=["steady", "control-no-cooldown"])
def test_a_worker_that_keeps_up_is_not_woken_for_each_job(
    dsn: str, schema: str, tmp_path: Path, cooldown: float
) -> None:
    # The control turns the cooldown off (a claim per wake-up): every enqueue notifies.
    queue = Queue(dsn, schema=schema)
    settings = {"concurrency": 50, "claim_cooldown": cooldown, "shutdown_grace": 5}
    log = tmp_path / "worker.log"
    proc = settings_worker_process(dsn, schema, settings, log=log)
    stop = threading.Event()
    counts = [0] * PRODUCERS
    s = sql.Identifier(schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as watch:
            _worker_row(watch, schema)
            threads = _start_stream(dsn, queue, stop, counts)
            try:
                if cooldown:
                    wait_until(lambda: _steady_rows(watch, schema) == 1, what="steady mode")
                else:
                    wait_until(lambda: sum(counts) >= 500, what="500 enqueues")
                with psycopg.connect(dsn, autocommit=True) as listener:
                    listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
                    before = sum(counts)
                    time.sleep(2.0)
                    during = sum(counts) - before
                    notes = [n.payload for n in listener.notifies(timeout=0.2)]
                steady_throughout = _steady_rows(watch, schema) == 1
            finally:
                _end_stream(stop, threads)
            _all_succeeded(watch, schema, sum(counts))
            left = watch.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(s)).fetchone()
            assert left == (0,)
    finally:
        stop_worker_processes([proc])
    clean_exit_logs([proc], [log])
    wakes = [n for n in notes if not n.startswith("!")]
    assert during > 500, during  # a stream, not a trickle
    if cooldown:
        assert steady_throughout
        # Wake-ups are for producers that checked while the worker was widened, nothing
        # more: a few in a hundred where the machine stalls the stream now and then (the
        # worker leaves steady mode and comes back), against every one in the control.
        assert len(wakes) < during * 0.1, (len(wakes), during)
    else:
        assert len(wakes) >= during * 0.9, (len(wakes), during)


def test_a_worker_idle_when_a_stream_begins_stops_being_woken_for_each_job(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """A worker with nothing to do parks its hint past every job (an empty claim from the
    floor: whatever comes next is announced). When a stream begins it must still become
    steady within a few claims: kept parked, its hint took each job as an urgent claim of
    the job announced, said no range of wake-ups to skip, and the worker was woken for
    every job until the hint's periodic reset, seconds later."""
    queue = Queue(dsn, schema=schema)
    settings = {"concurrency": 50, "shutdown_grace": 5}
    log = tmp_path / "worker.log"
    proc = settings_worker_process(dsn, schema, settings, log=log)
    stop = threading.Event()
    counts = [0] * PRODUCERS
    try:
        with psycopg.connect(dsn, autocommit=True) as watch:
            _worker_row(watch, schema)
            time.sleep(0.5)  # its first claims find nothing: the hint is parked
            with psycopg.connect(dsn, autocommit=True) as listener:
                listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
                threads = _start_stream(dsn, queue, stop, counts)
                try:
                    time.sleep(2.0)
                    during = sum(counts)
                    notes = [n.payload for n in listener.notifies(timeout=0.2)]
                finally:
                    _end_stream(stop, threads)
            _all_succeeded(watch, schema, sum(counts))
    finally:
        stop_worker_processes([proc])
    clean_exit_logs([proc], [log])
    wakes = [n for n in notes if not n.startswith("!")]
    assert during > 500, during  # a stream, not a trickle
    # The jobs of its first claims wake it, until a window of them says steady; a stalled
    # stream may take it out and back once or twice. Every job woke it before.
    assert len(wakes) < during * 0.25, (len(wakes), during)


def test_a_job_committed_late_below_the_hint_runs_while_the_worker_stays_steady(
    queue: Queue, dsn: str, schema: str
) -> None:
    # The worker polls once a minute and never resets its hint: only the claims' snapshots
    # can find each probe, enqueued (its id drawn, no wake-up sent) while the stream runs,
    # and committed after the worker has claimed jobs enqueued after it.
    ran: list[int] = []
    seen = threading.Event()

    @queue.task(name="probe")
    def probe(n: int) -> None:
        ran.append(n)

    @queue.task(name="marker")
    def marker() -> None:
        seen.set()

    @queue.task(name="noop")
    def noop() -> None:  # the stream's jobs
        pass

    worker = Worker(
        queue,
        dsn=dsn,
        concurrency=50,
        poll_interval=60,
        hint_reset_interval=3600,
        hint_reset_jitter=0,
    )
    rng = random.Random(33)
    stop = threading.Event()
    counts = [0] * 4
    threads = [
        threading.Thread(target=_stream, args=(dsn, queue, stop, counts, n, 0.0005))
        for n in range(4)
    ]
    rounds = 20
    steady_probes: set[int] = set()
    with (
        worker_in_thread(worker, force=True),
        psycopg.connect(dsn, autocommit=True) as watch,
        psycopg.connect(dsn, autocommit=True) as listener,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        for thread in threads:
            thread.start()
        try:
            wait_until(lambda: _steady_rows(watch, schema) == 1, what="steady mode")
            loop = worker.current.fetch_loop
            assert loop is not None
            for n in range(rounds):
                spells, was_steady = loop.pace.spells, loop.pace.steady
                with psycopg.connect(dsn) as conn:
                    job = queue.enqueue(probe.job(n), conn=conn)  # no wake-up: steady
                    seen.clear()
                    queue.enqueue(marker.job())  # after the probe, in its own transaction
                    assert seen.wait(10)  # a claim has passed the probe's id
                    time.sleep(rng.uniform(0, 0.01))
                    conn.commit()
                # Far sooner than the poll a minute away, or any hint reset.
                wait_until(lambda n=n: ran[-1:] == [n], timeout=10, what=f"probe {n}")
                assert job.id is not None
                # A round the worker spent steady throughout: no widening's floor claim can
                # have found its probe, only the claims' snapshots.
                if was_steady and loop.pace.steady and loop.pace.spells == spells:
                    steady_probes.add(job.id)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        probe_ids = {
            row[0]
            for row in watch.execute(
                sql.SQL("SELECT id FROM {}.job_history WHERE task = 'probe'").format(
                    sql.Identifier(schema)
                )
            )
        }
        notes = [n.payload for n in listener.notifies(timeout=0.2)]
    assert ran == list(range(rounds))
    assert steady_probes <= probe_ids
    # The stream comes from threads of this process, beside the worker's: on a slow
    # machine it can stall for longer than the worker's window, which then leaves steady
    # mode (too few jobs) and comes back. Most rounds still run steady throughout.
    assert len(steady_probes) >= rounds * 3 // 4, len(steady_probes)
    named = {int(note.split()[2]) for note in notes if not note.startswith("!")}
    # The snapshots found those probes, not wake-ups. An empty claim from the floor while a
    # transaction is in progress parks the hint past everything until a claim finds a job
    # (claimer.py), and the worker asks for every wake-up meanwhile: a probe enqueued in
    # that moment is announced. That is rare; a worker that announced every probe is not.
    assert len(steady_probes & named) <= 2, sorted(steady_probes & named)
    assert worker.current.claimer.hints.rewinds > 0


def test_jobs_that_come_back_wake_a_steady_worker_and_new_ones_do_not(
    dsn: str, schema: str
) -> None:
    # A steady row skips new jobs' wake-ups (wake_new) and never those of jobs that come
    # back below the hint (wake: retried, promoted, released, unparked, signalled); a busy
    # row skips both, as before.
    s = sql.Identifier(schema)
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        psycopg.connect(dsn, autocommit=True) as listener,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
        (worker_id,) = conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
                " VALUES ('steady test', 'test', 1, ARRAY['default'], 1) RETURNING id"
            ).format(s)
        ).fetchone() or (0,)

        def heard(function: str, new_only: bool) -> bool:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.wake_listeners (worker_id, queue, below, above, new_only)"
                    " VALUES (%s, 'default', -32768, 32767, %s)"
                    " ON CONFLICT (worker_id, queue) DO UPDATE SET new_only = excluded.new_only"
                ).format(s),
                [worker_id, new_only],
            )
            conn.execute(
                sql.SQL("SELECT {}.{}('default', 0, 7)").format(s, sql.Identifier(function))
            )
            return any(n.payload == "default 0 7" for n in listener.notifies(timeout=0.2))

        assert not heard("wake_new", new_only=True)
        assert heard("wake", new_only=True)
        assert not heard("wake_new", new_only=False)
        assert not heard("wake", new_only=False)


def test_every_insert_into_jobs_takes_its_transaction_id_before_any_job_id(
    queue: Queue, dsn: str, schema: str
) -> None:
    # The claims' snapshots only name the transactions that hold unseen jobs if each took
    # its id before it drew theirs: the statement-level trigger does it before the first
    # row, even for a statement that inserts none; the bulk enqueue's reservation too.
    s = sql.Identifier(schema)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args) SELECT 'q', 't', '{{}}' WHERE false"
            ).format(s)
        )
        assigned = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
        assert assigned is not None and assigned[0] is not None
        conn.rollback()
        assert conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone() == (None,)
        # A sequence writes WAL, and so takes the transaction's id itself, at one nextval in
        # 32: three reservations of one id in a row would not all have one without the fix.
        for _ in range(3):
            conn.execute(query("job_id_reserve", schema), {"n": 1})
            assigned = conn.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()
            assert assigned is not None and assigned[0] is not None
            conn.rollback()


@pytest.mark.parametrize("young", [True, False], ids=["young", "control-old"])
def test_a_steady_claim_starts_where_it_passed_a_transaction_still_young(
    queue: Queue, dsn: str, schema: str, young: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One claimer, claims made by hand. A probe's transaction draws its id, a later job
    # commits and is claimed past it, then the probe commits. While that transaction is
    # young, the next claim starts where the claim that passed it began and takes the
    # probe at once; the control makes every transaction old, so the probe waits for the
    # rewind: one claim to see its transaction ended, the next to walk back.
    if not young:
        monkeypatch.setattr(hints_module, "YOUNG_SECONDS", -1.0)

    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> list[list[int]]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            first = queue.enqueue(noop.job(), conn=conn)
            rounds = [[j.id for j in (await claimer.claim_round(10))[0]]]
            assert rounds == [[first.id]]
            with psycopg.connect(dsn) as held:
                probe = queue.enqueue(noop.job(), conn=held)  # in progress
                later = queue.enqueue(noop.job(), conn=conn)
                rounds.append([j.id for j in (await claimer.claim_round(10))[0]])
                assert rounds[-1] == [later.id]  # passed the probe, unseen
                held.commit()
            for _ in range(2):
                rounds.append([j.id for j in (await claimer.claim_round(10))[0]])
            assert probe.id is not None
            return [[n - probe.id for n in r] for r in rounds[2:]]

    after_commit = asyncio.run(scenario())
    assert after_commit == ([[0], []] if young else [[], [0]])


@pytest.mark.parametrize("in_progress", [False, True], ids=["none-open", "control-one-open"])
def test_an_empty_claim_from_the_floor_keeps_a_steady_queue_steady(
    queue: Queue, dsn: str, schema: str, in_progress: bool
) -> None:
    # A steady queue's hint is dropped for a claim from the floor (a reset, a rewind) and
    # that claim finds nothing. With no transaction in progress every job id drawn so far is
    # behind the old hint, which it goes back to: the worker can still say which new jobs it
    # will find without a wake-up. The control keeps a transaction open that has drawn a job
    # id: the hint is parked past everything and every wake-up is asked for, as before.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> tuple[Any, Any]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            with psycopg.connect(dsn) as held:
                queue.enqueue(noop.job(), conn=conn)
                assert len((await claimer.claim_round(10))[0]) == 1
                kept = claimer.wake_range("default")
                if in_progress:
                    queue.enqueue(noop.job(), conn=held)
                    # A snapshot lists the transactions in progress below the newest one
                    # that ended: end one with a later id, as a busy server always has.
                    conn.execute("SELECT pg_current_xact_id()")
                claimer.forget_hints()
                assert (await claimer.claim_round(10))[0] == []
                return kept, claimer.wake_range("default")

    kept, after = asyncio.run(scenario())
    assert kept == (0, 32767)  # new jobs of priority 0 and after are found by claims
    assert after == (None if in_progress else kept)


@pytest.mark.parametrize("seen_steady", [True, False], ids=["seen-steady", "control-never"])
def test_a_transaction_passed_while_steady_is_claimed_back_after_the_queue_leaves_steady(
    queue: Queue, dsn: str, schema: str, seen_steady: bool
) -> None:
    # A probe's wake-up was skipped while the queue was steady, and a claim passed it then;
    # the worker leaves steady mode before the probe commits. The claim after the commit
    # still walks back for it: nothing else would announce it before a hint reset. The
    # control passes it while not steady (its wake-up would have been sent): no walk back.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> list[int]:
        async with claimer_by_hand(dsn, schema, steady=seen_steady) as (claimer, conn):
            queue.enqueue(noop.job(), conn=conn)
            assert len((await claimer.claim_round(10))[0]) == 1
            with psycopg.connect(dsn) as held:
                probe = await _passed_unseen(queue, claimer, conn, held, noop)
                claimer.hints.steady = set()
                held.commit()
            return await _claims_after(claimer, probe)

    assert asyncio.run(scenario()) == ([0] if seen_steady else [])


@pytest.mark.parametrize("new_only", [True, False], ids=["steady", "control-busy"])
def test_a_steady_queue_asking_for_every_wake_up_again_keeps_its_hint(
    queue: Queue, dsn: str, schema: str, new_only: bool
) -> None:
    # The rows skipped new jobs only (steady) when the worker asks for every wake-up again
    # (a widening): its claims followed what they could not see, so the hint is kept and no
    # claim starts from the floor, which under a long transaction walks every dead entry. A
    # probe passed while steady, its transaction in progress at the widening, is claimed by
    # the first claim after its end is seen. The control's rows skipped jobs that came back
    # too (busy): its hint is forgotten, and the claim after the widening starts from the
    # floor.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> tuple[int, bool]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            interest = WakeInterest(claimer.link, schema, claimer.worker_id, claimer, 1.0)
            queue.enqueue(noop.job(), conn=conn)
            assert len((await claimer.claim_round(10))[0]) == 1
            await interest.ask({"default": (0, 32767, new_only)})
            with psycopg.connect(dsn) as held:
                probe = await _passed_unseen(queue, claimer, conn, held, noop)
                claimer.hints.steady = set()
                unhinted = claimer.stats.unhinted_claims
                assert await interest.ask({"default": None})  # a widening
                assert (await claimer.claim_round(10))[0] == []
                floor = claimer.stats.unhinted_claims - unhinted
                held.commit()
            await asyncio.sleep(FIRST_CHECK * 4)
            assert await interest.settle()
            got = [j.id for j in (await claimer.claim_round(10))[0]]
            return floor, got == [probe]

    floor, found = asyncio.run(scenario())
    assert found
    assert floor == (0 if new_only else 1)


def test_a_transaction_newer_than_every_ended_one_is_followed_too(
    queue: Queue, dsn: str, schema: str
) -> None:
    # A snapshot lists the transactions in progress only below the newest one that ended;
    # newer ones are in progress without being named. Here the probe's transaction takes its
    # id after the later job's and draws its job id before it: when the later job's commit
    # is the newest end, the claim that passes the probe cannot name its transaction. The
    # claim also says up to where ids were handed out when it ran (its own transaction's),
    # and the worker steps back for the range it could not see.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> list[int]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            queue.enqueue(noop.job(), conn=conn)
            assert len((await claimer.claim_round(10))[0]) == 1
            with psycopg.connect(dsn) as earlier, psycopg.connect(dsn) as held:
                earlier.execute("SELECT pg_current_xact_id()")
                probe = queue.enqueue(noop.job(), conn=held)  # a later transaction id
                later = queue.enqueue(noop.job(), conn=earlier)  # a later job id
                earlier.commit()
                snapshot = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
                xid = held.execute("SELECT pg_current_xact_id()::text").fetchone()
                assert snapshot is not None and xid is not None
                xmax = int(snapshot[0].split(":")[1])
                assert int(xid[0]) >= xmax  # the probe's transaction is not named
                got = [j.id for j in (await claimer.claim_round(10))[0]]
                assert got == [later.id]  # passed the probe, unseen and unnamed
                held.commit()
            return await _claims_after(claimer, probe.id)

    assert asyncio.run(scenario()) == [0]


async def _passed_unseen(
    queue: Queue,
    claimer: claimer_module.Claimer,
    conn: psycopg.Connection[Any],
    held: psycopg.Connection[Any],
    task: Any,
) -> int:
    """A probe enqueued on `held`, left in progress, and a job after it committed on `conn`
    and claimed: the claim passed the probe unseen. Returns the probe's id."""
    probe = queue.enqueue(task.job(), conn=held)
    later = queue.enqueue(task.job(), conn=conn)
    got = [j.id for j in (await claimer.claim_round(10))[0]]
    assert got == [later.id]
    assert probe.id is not None
    return probe.id


async def _claims_after(claimer: Any, probe: int | None) -> list[int]:
    """The ids three more claims take, less the probe's (0: the probe)."""
    assert probe is not None
    found: list[int] = []
    for _ in range(3):
        found += [j.id - probe for j in (await claimer.claim_round(10))[0]]
    return found


async def _skip_as_steady(claimer: claimer_module.Claimer, schema: str) -> tuple[int, int]:
    """Write the claimer's wake_listeners row as a steady worker's loop does before it sleeps
    (its wake_range, new jobs only); returns the range written."""
    found = claimer.wake_range("default")
    assert found is not None
    store = WorkersStore(schema)
    ranges = {"default": (*found, True)}
    await claimer.link.run(lambda c: store.skip_wakes(c, claimer.worker_id, ranges))
    return found


def _hear(
    listener: psycopg.Connection[Any], claimer: claimer_module.Claimer
) -> list[Position | None]:
    """Pass the wake-ups sent so far to the claimer, as the notifier would."""
    heard = []
    for note in listener.notifies(timeout=0.2):
        wake = wakeup.parse(note.payload)
        if isinstance(wake, wakeup.Wake):
            claimer.announce(wake.queue, wake.position)
            heard.append(wake.position)
    return heard


@pytest.mark.parametrize("priority", [0, -1], ids=["hint-priority", "more-urgent"])
def test_a_late_commit_seen_only_by_a_claim_from_the_floor_is_found_at_once(
    queue: Queue, dsn: str, schema: str, priority: int
) -> None:
    # The hint is dropped (a reset) while the queue is steady, its row written as the loop
    # writes it. A probe's transaction takes its id after the last claim, so only the claim
    # from the floor sees it in progress; that claim passes it (a later job committed). The
    # floor claim watches it from where the hint was, not from the floor: at the hint's
    # priority the probe lies after that, and a more urgent one is announced, since the
    # row keeps the hint's priority as its bound while the hint is dropped. Either way the
    # claims after its commit take it (the step back, or the announced range), without
    # walking from the floor again.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> tuple[list[int], int, tuple[int, int], list[Position | None]]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            with psycopg.connect(dsn, autocommit=True) as listener:
                listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
                queue.enqueue(noop.job(), conn=conn)
                assert len((await claimer.claim_round(10))[0]) == 1
                # Other sessions of a shared server, watched from the floor by the first
                # claim, would add claims from the floor as they end.
                claimer.hints["default"].watch.clear()
                claimer.hints["default"].unnamed = None
                claimer.forget_hints()  # the safety net's reset
                dropped = await _skip_as_steady(claimer, schema)
                with psycopg.connect(dsn) as held:
                    probe = queue.enqueue(noop.job(), conn=held, priority=priority)
                    later = queue.enqueue(noop.job(), conn=conn)
                    floor = claimer.stats.unhinted_claims
                    got = [j.id for j in (await claimer.claim_round(10))[0]]
                    assert got == [later.id]  # passed the probe, unseen
                    assert claimer.stats.unhinted_claims == floor + 1
                    held.commit()
                heard = _hear(listener, claimer)
                assert probe.id is not None
                found = []
                for _ in range(2):  # one to see the commit, one to step back
                    found += [j.id - probe.id for j in (await claimer.claim_round(10))[0]]
                return found, claimer.stats.unhinted_claims - floor, dropped, heard

    found, floor_claims, dropped, heard = asyncio.run(scenario())
    assert dropped == (0, 32767)  # the hint's priority and after, not every priority
    assert found == [0]
    assert floor_claims == 1
    # Announced only when more urgent than the hint: at its priority, a steady row skips it.
    assert len(heard) == (1 if priority < 0 else 0)


@pytest.mark.parametrize("relistened", [False, True], ids=["reset", "control-relistened"])
def test_one_claim_from_the_floor_does_not_lead_a_steady_queue_to_the_next(
    queue: Queue, dsn: str, schema: str, relistened: bool
) -> None:
    # bench/degradation/floor_chain.py's scenario: the hint of a steady queue is dropped
    # once, then each round has an enqueue in progress during the claim (it commits after)
    # and a later one committed. Under a long transaction each claim from the floor walks
    # every dead entry of the claim index; a floor claim that watched those transactions
    # from the floor sent the next claim there, every other round, for as long as the
    # stream lasted. Watched from where the hint was, the reset costs one claim from the
    # floor. The same holds for steps back: a claim that starts at one watches from where
    # the hint was before it, or the position would be handed on from claim to claim and
    # each would walk back over every job claimed since. The control loses the listener
    # instead: nothing can be assumed about the wake-ups missed, so that claim watches from
    # the floor, and one more follows.
    @queue.task(name="noop")
    def noop() -> None:
        pass

    async def scenario() -> tuple[int, int, int, int]:
        async with claimer_by_hand(dsn, schema) as (claimer, conn):
            hint = claimer.hints["default"]
            back = 0  # held transactions watched from before where the hint was left
            enqueued = [queue.enqueue(noop.job(), conn=conn)]
            claimed = len((await claimer.claim_round(10))[0])
            # The first claim has nowhere but the floor to watch from; on a shared server
            # other sessions' transactions may be in progress then, and their ends would
            # add claims from the floor this test is not about.
            hint.watch.clear()
            hint.unnamed = None
            if relistened:
                claimer._relistened()
            else:
                claimer.forget_hints()
            floor = claimer.stats.unhinted_claims
            for _ in range(8):
                with psycopg.connect(dsn) as held:
                    enqueued.append(queue.enqueue(noop.job(), conn=held))  # in progress
                    xid = held.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
                    enqueued.append(queue.enqueue(noop.job(), conn=conn))
                    left = hint.after
                    claimed += len((await claimer.claim_round(10))[0])
                    assert left is not None and xid is not None
                    back += hint.watch[xid[0]].at < left
                    held.commit()
            for _ in range(2):  # the last one in progress, committed
                claimed += len((await claimer.claim_round(10))[0])
            return claimer.stats.unhinted_claims - floor, back, claimed, len(enqueued)

    floor_claims, back, claimed, enqueued = asyncio.run(scenario())
    assert claimed == enqueued  # none left behind
    # Other sessions of a shared server, watched from the floor after the lost listener,
    # may add to the control's as they end.
    assert floor_claims == 1 if not relistened else floor_claims >= 2
    assert back == (1 if relistened else 0)
