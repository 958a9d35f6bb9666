"""The claim hint never starves a job, and finds it without an unhinted claim.

Workers claim after the last (priority, id) they took. A job that becomes claimable below the
hint (committed late with a lower id, more urgent, or promoted from scheduled) is named by its
wake-up, so the worker claims from there next: with the periodic reset switched off, the job
still runs within a few busy jobs, and the worker makes no unhinted claim for it, also while
a snapshot holds thousands of dead entries in the index. The controls show the test can tell
the difference: without wake-ups (poll_only) the late job waits for the whole backlog.

A worker whose slots have all been busy for quiet_after asks only for the wake-ups of jobs
more urgent than its hint (interest.py): a more urgent job still runs at once, while a job
committed late at the hint's priority is found by the next claim from the floor, when the
worker runs out of work, or by the periodic reset's sweep. The late-commit tests that expect
a wake-up run with quiet_after=None, every wake-up asked for.

A job no wake-up names (it was locked by someone else when the claims passed it) is found
within one reset interval, and otherwise only once the worker runs out of work.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Queue, RetryPolicy, Worker
from pgqueue.queries import query
from pgqueue.testing import drain
from tests.conftest import listen_for_wakes, wait_until, worker_in_thread

# Run on each server CI tests against: what the hinted claim sees is the server's visibility.
pytestmark = [
    pytest.mark.each_server,
    # These count the claims from the floor. A claim watches the transactions in progress on
    # the whole server, other databases' too: on a server shared with other tests, theirs
    # end at random and rewind the hint an extra time.
    pytest.mark.alone,
]

BACKLOG = 400
NO_RESET = 3600.0  # the periodic reset never fires within a test


class _Run:
    """Busy jobs of 10 ms each, and one special job whose place in the run order is the point."""

    def __init__(self, queue: Queue) -> None:
        self.order: list[str] = []
        self.released_at = 0  # busy jobs done when the special job became claimable
        self.warmed = threading.Event()
        self.special_ran = threading.Event()

        @queue.task(name="busy")
        def busy(i: int) -> None:
            time.sleep(0.01)
            self.order.append(f"b{i}")
            if len(self.order) >= 20:
                self.warmed.set()

        self.unhinted_at_special: int | None = None  # the worker's unhinted claims by then
        self.widenings_at_special: int | None = None  # and its widenings
        self.worker: Worker | None = None

        @queue.task(name="special")
        def special(label: str) -> None:
            self.order.append(label)
            if self.worker is not None:
                self.unhinted_at_special = self.worker.stats.unhinted_claims
                if self.worker.current.interest is not None:
                    self.widenings_at_special = self.worker.current.interest.widenings
            self.special_ran.set()

        self.busy, self.special = busy, special

    def delay_after(self, label: str, trigger: Callable[[], None]) -> tuple[int, int]:
        """Run `trigger` once warmed; (busy jobs done before `label` ran, done at trigger)."""
        assert self.warmed.wait(30)
        trigger()
        at = len(self.order)
        assert self.special_ran.wait(60)
        # Every due job is found, not only the special one.
        wait_until(lambda: len(self.order) == BACKLOG + 1, what="the whole backlog")
        assert sorted(self.order) == sorted([label] + [f"b{i}" for i in range(BACKLOG)])
        return self.order.index(label), at


def _worker(queue: Queue, dsn: str, reset_seconds: float = NO_RESET, **options: Any) -> Worker:
    settings: dict[str, Any] = {"concurrency": 1, "poll_interval": 0.2, "hint_reset_jitter": 0.5}
    return Worker(queue, dsn=dsn, **settings | options, hint_reset_interval=reset_seconds)


@contextmanager
def _held_snapshot(dsn: str, queue: Queue) -> Iterator[None]:
    """A REPEATABLE READ snapshot held idle while 2,000 jobs run and finish in front of it:
    their dead index entries cannot be cleaned, as under a long transaction."""
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class")
        churn = queue.task(name="churn")(lambda: None)
        queue.enqueue_many([churn.job() for _ in range(2000)])
        drain(queue, concurrency=50)
        yield
        holder.rollback()


def _late_commit(queue: Queue, dsn: str, hold: bool, **options: Any) -> tuple[int, int, int]:
    """(busy jobs done before the late job ran, done when it committed, unhinted claims made
    between its commit and its run)."""
    with _held_snapshot(dsn, queue) if hold else contextlib.nullcontext():
        run = _Run(queue)
        with psycopg.connect(dsn) as late, psycopg.connect(dsn) as other:
            late_id = queue.enqueue(run.special.job("late"), conn=late)  # lowest id, open
            ids = queue.enqueue_many([run.busy.job(i) for i in range(BACKLOG)], conn=other)
            other.commit()
            assert late_id < min(ids)
            worker = run.worker = _worker(queue, dsn, **options)
            with worker_in_thread(worker, force=True):
                unhinted: list[int] = []

                def commit() -> None:
                    unhinted.append(worker.stats.unhinted_claims)
                    late.commit()

                ran_at, committed_at = run.delay_after("late", commit)
                assert run.unhinted_at_special is not None
                return ran_at, committed_at, run.unhinted_at_special - unhinted[0]


@pytest.mark.parametrize("hold", [False, True], ids=["plain", "snapshot-held"])
def test_job_committed_late_below_the_hint_runs_at_once_without_an_unhinted_claim(
    queue: Queue, dsn: str, hold: bool
) -> None:
    # Held: 2,000 dead entries sit in the claim index and the late job's id is below them all.
    ran_at, committed_at, unhinted = _late_commit(queue, dsn, hold, quiet_after=None)
    # Busy jobs take 10 ms each; the wake-up arrives within a few of them, not 380.
    assert ran_at - committed_at < 50, (ran_at, committed_at)
    assert unhinted <= 1, unhinted  # at most the burst of the wake-up racing the first claim


def test_control_without_wake_ups_the_late_job_waits_for_the_whole_backlog(
    queue: Queue, dsn: str
) -> None:
    # poll_only: no listener, so nothing announces the late job; batches of 1 never come back
    # short while the backlog lasts, so nothing sends the claim back to the floor either.
    ran_at, _, _ = _late_commit(queue, dsn, hold=False, poll_only=True)
    assert ran_at >= BACKLOG - 1


def _skipped(dsn: str, schema: str) -> list[tuple[int, int]]:
    """The priorities whose wake-ups the workers' wake_listeners rows skip (interest.py)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT below, above FROM {}.wake_listeners").format(sql.Identifier(schema))
        ).fetchall()
    return [(row[0], row[1]) for row in rows]


QUIET = [(0, 32767)]  # busy: skips priority 0 and after, what its next claim finds anyway
WAITING = [(32768, 32767)]  # skips nothing


def test_more_urgent_job_enqueued_after_the_hint_runs_next(
    queue: Queue, dsn: str, schema: str
) -> None:
    run = _Run(queue)
    queue.enqueue_many([run.busy.job(i) for i in range(BACKLOG)])
    worker = run.worker = _worker(queue, dsn, quiet_after=0.05)
    with worker_in_thread(worker, force=True):
        unhinted: list[int] = []
        # Busy: the worker wants only wake-ups of jobs more urgent than its hint's priority.
        wait_until(lambda: _skipped(dsn, schema) == QUIET, what="the worker to go quiet")

        def enqueue_urgent() -> None:
            unhinted.append(worker.stats.unhinted_claims)
            queue.enqueue(run.special.job("urgent"), priority=-5)

        ran_at, enqueued_at = run.delay_after("urgent", enqueue_urgent)
        assert run.unhinted_at_special == unhinted[0]
    assert ran_at - enqueued_at < 50, (ran_at, enqueued_at)


def _settled(worker: Worker) -> bool:
    """The worker waits for work and watches no transaction from an earlier widening."""
    return worker.current.interest is not None and worker.current.interest.next_check() is None


def test_quiet_worker_finds_a_job_committed_late_at_its_priority_when_out_of_work(
    queue: Queue, dsn: str, schema: str
) -> None:
    # Nothing announces the late job to a worker that went quiet (and no reset here): the
    # claim from the floor that follows its widening, once out of work, finds it.
    run = _Run(queue)
    first = 100
    queue.enqueue_many([run.busy.job(i) for i in range(first)])
    worker = run.worker = _worker(queue, dsn, quiet_after=0.05)
    with worker_in_thread(worker, force=True), psycopg.connect(dsn) as late:
        wait_until(lambda: _skipped(dsn, schema) == QUIET, what="the worker to go quiet")
        assert worker.current.interest is not None
        widenings = worker.current.interest.widenings
        late_id = queue.enqueue(run.special.job("late"), conn=late)  # opened after that
        ids = queue.enqueue_many([run.busy.job(i) for i in range(first, BACKLOG)])
        assert late_id < min(ids)
        wait_until(lambda: len(run.order) > first + 10, what="claims past the late job")
        late.commit()
        committed_at = len(run.order)
        assert run.special_ran.wait(60)
        wait_until(lambda: _skipped(dsn, schema) == WAITING, what="the worker to wait")
    # Found only by a claim from the floor after a widening: once the worker ran out of
    # work, or sooner where a claim came back short while the late job's transaction was
    # open (a slow start of the second batch): never by a wake-up, which nothing sent.
    ran_at = run.order.index("late")
    assert run.widenings_at_special is not None
    assert run.widenings_at_special > widenings, (ran_at, committed_at)
    if ran_at != BACKLOG:
        assert worker.current.interest.settlements > 0, (ran_at, committed_at)


def test_scheduled_job_falling_due_after_the_hint_passed_it_runs_at_once(
    queue: Queue, dsn: str, schema: str
) -> None:
    run = _Run(queue)
    with psycopg.connect(dsn) as conn:
        due_id = queue.enqueue(run.special.job("due"), conn=conn, delay=timedelta(hours=1))
        queue.enqueue_many([run.busy.job(i) for i in range(BACKLOG)], conn=conn)
        conn.commit()
        worker = _worker(queue, dsn, poll_interval=0.1)
        with worker_in_thread(worker, force=True):

            def fall_due() -> None:
                conn.execute(
                    sql.SQL("UPDATE {}.jobs SET run_at = now() WHERE id = %s").format(
                        sql.Identifier(schema)
                    ),
                    [due_id],
                )
                conn.commit()

            # Promotion names the job's position in its wake-up; no reset is needed.
            ran_at, due_at = run.delay_after("due", fall_due)
    assert ran_at - due_at < 50, (ran_at, due_at)


def _locked_while_passed(queue: Queue, dsn: str, schema: str, reset_seconds: float) -> _Run:
    """A queued job is locked by another session while the worker's claims pass it, then
    released without any wake-up; returns once the busy backlog is done and the worker has
    polled five more times after it."""
    run = _Run(queue)
    worker = _worker(queue, dsn, reset_seconds=reset_seconds)
    with worker_in_thread(worker, force=True), psycopg.connect(dsn) as locker:
        # The locker starts once the worker watches no transaction (a widening's claim from
        # the floor after the locker ended would find the job), behind a pause.
        wait_until(lambda: _settled(worker), what="the worker to wait for work")
        queue.pause_queue("default")
        wait_until(lambda: "default" in worker.paused, what="the worker to hear the pause")
        lonely_id = queue.enqueue(run.special.job("lonely"))
        queue.enqueue_many([run.busy.job(i) for i in range(BACKLOG)])
        locker.execute(
            sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            [lonely_id],
        )
        queue.resume_queue("default")
        assert run.warmed.wait(30)
        locker.rollback()
        run.released_at = len(run.order)
        wait_until(
            lambda: sum(1 for o in run.order if o != "lonely") == BACKLOG,
            what="the busy backlog",
        )
        claims = worker.stats.claims
        wait_until(lambda: worker.stats.claims >= claims + 5, what="five more polls")
    return run


def test_job_no_wake_up_names_is_found_by_the_periodic_reset(
    queue: Queue, dsn: str, schema: str
) -> None:
    run = _locked_while_passed(queue, dsn, schema, reset_seconds=0.2)
    # One reset (0.2 s +- 50%) is about 30 busy jobs, not 380.
    assert run.order.index("lonely") - run.released_at < 150


def test_control_without_the_reset_the_job_no_wake_up_names_waits_for_the_backlog(
    queue: Queue, dsn: str, schema: str
) -> None:
    # Found only by the claim from the floor made when the worker runs out of work.
    run = _locked_while_passed(queue, dsn, schema, reset_seconds=NO_RESET)
    assert run.order.index("lonely") == BACKLOG


def test_job_retried_at_once_runs_again_without_waiting_for_the_backlog(
    queue: Queue, dsn: str
) -> None:
    run = _Run(queue)
    failed_once = threading.Event()

    @queue.task(name="flaky", retry=RetryPolicy(base=timedelta(0), jitter=0.0))
    def flaky() -> None:
        if not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("first attempt fails")
        run.order.append("flaky")
        run.special_ran.set()

    # The flaky job runs first; its retry goes back to queued at its old id, below the hint.
    queue.enqueue(flaky.job())
    queue.enqueue_many([run.busy.job(i) for i in range(BACKLOG)])
    with worker_in_thread(_worker(queue, dsn), force=True):
        assert run.special_ran.wait(60)
        wait_until(lambda: len(run.order) == BACKLOG + 1, what="the whole backlog")
    assert failed_once.is_set()
    assert run.order.index("flaky") < 50, run.order.index("flaky")


def test_jobs_put_back_are_announced_with_their_lowest_position(
    queue: Queue, dsn: str, schema: str
) -> None:
    t = queue.task(name="t")(lambda: None)
    ids = queue.enqueue_many([t.job() for _ in range(3)] + [t.with_options(priority=-2).job()])
    table = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE {}.jobs SET status = 'running', worker_id = 7, attempt = 1").format(
                table
            )
        )
        listen_for_wakes(conn, schema)
        conn.execute(query("job_release_many", schema), {"ids": ids[1:], "worker_id": 7}).fetchone()
        released = [n.payload for n in conn.notifies(timeout=0.5, stop_after=1)]
        # The orphan release puts back what is left, naming its lowest position too.
        conn.execute(query("job_release_orphans", schema), {"worker_id": 7, "known": []})
        orphans = [n.payload for n in conn.notifies(timeout=0.5, stop_after=1)]
    assert released == [f"default -2 {ids[3]}"]
    assert orphans == [f"default 0 {ids[0]}"]


def test_worker_that_keeps_up_claims_from_the_floor_only_once(queue: Queue, dsn: str) -> None:
    # Regression (bench/degradation/suite.py, 10 minutes with a snapshot held): after a claim
    # from the floor found the queue empty, every following claim walked from the floor again
    # while the worker kept the queue empty, 200 ms each by then. Wake-ups must be enough.
    done: list[int] = []
    t = queue.task(name="t")(lambda i: done.append(i))
    worker = _worker(queue, dsn, concurrency=4)
    with worker_in_thread(worker, force=True), psycopg.connect(dsn, autocommit=True) as watch:
        # Once its listener is up, the worker forgets its hints once (wake-ups sent before
        # were missed) and claims from the floor; only then does the count start.
        listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s"
        pattern = [f"LISTEN %{queue.channel}%"]
        wait_until(
            lambda: watch.execute(listening, pattern).fetchone() == (1,), what="the listener"
        )
        claims = worker.stats.claims
        wait_until(lambda: worker.stats.claims >= claims + 2, what="two polls after it")
        unhinted = worker.stats.unhinted_claims
        with psycopg.connect(dsn) as late:
            queue.enqueue(t.job(-1), conn=late)  # committed last, below everything
            for i in range(60):
                urgent: dict[str, Any] = {"priority": -3} if i % 10 == 0 else {}
                queue.enqueue(t.job(i), **urgent)
                if i % 20 == 0:
                    wait_until(lambda n=i: len(done) == n + 1, what=f"job {i}")
            late.commit()
        wait_until(lambda: len(done) == 61, what="every job")
        assert worker.stats.unhinted_claims == unhinted
    assert sorted(done) == list(range(-1, 60))
