"""Workflows under several real worker processes: a job that waits never starts before what
it waits for has finished and is released once, and a chord's callback runs exactly once
although its members finish at the same moment on different workers; also when a worker is
killed (SIGKILL) mid-step and steps fail and retry.

Handlers record their start and end on one monotonic clock for all processes
(tests/apps/tasks.py: wf_step, wf_collect); the checks read those records, not the database's view.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import Queue, chain, chord, group
from tests.apps import tasks as apps
from tests.conftest import (
    clean_exit_logs,
    count,
    settings_worker_process,
    stop_worker_processes,
    wait_until,
)

FAST: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "lease_timeout": 1.0,
    "rescue_interval": 0.2,
    "concurrency": 8,
    "poll_interval": 0.5,
}


def _events(runs: Path) -> dict[int, list[tuple[str, int, int, int]]]:
    """Per job: (event, monotonic ns, attempt, value) in the order recorded."""
    out: dict[int, list[tuple[str, int, int, int]]] = defaultdict(list)
    for job_id, rest in apps.read_runs(runs):
        event, ns, attempt, value = rest.split()
        out[job_id].append((event, int(ns), int(attempt), int(value)))
    return out


def _ended_once(events: list[tuple[str, int, int, int]]) -> tuple[int, int]:
    """The one successful run's (start ns, end ns): its 'end' and the 'start' before it."""
    ends = [e for e in events if e[0] == "end"]
    assert len(ends) == 1, events
    attempt = ends[0][2]
    starts = [e for e in events if e[0] == "start" and e[2] == attempt]
    assert len(starts) == 1, events
    return starts[0][1], ends[0][1]


def _ended(events: list[tuple[str, int, int, int]]) -> int:
    """When a job last ended well, checking each attempt ended at most once. A job whose
    worker was killed after its handler returned but before its outcome was written runs
    again, as a lease job does: at least once, each run a new attempt, never one attempt
    twice."""
    ends = [e for e in events if e[0] == "end"]
    attempts = [e[2] for e in ends]
    assert ends and len(set(attempts)) == len(attempts), events
    return max(e[1] for e in ends)


def _first_start(events: list[tuple[str, int, int, int]]) -> int:
    return min(e[1] for e in events if e[0] == "start")


def _wait_all(dsn: str, schema: str, total: int) -> None:
    with psycopg.connect(dsn) as conn:

        def finished() -> bool:
            done = count(conn, schema, "job_history")
            conn.commit()
            return done == total

        wait_until(finished, timeout=240, what=f"{total} finished jobs")
        assert count(conn, schema, "job_history", "status = 'succeeded'") == total
        for table in ("jobs", "job_deps", "job_waits"):
            assert count(conn, schema, table) == 0, table


def test_chords_and_chains_across_worker_processes(dsn: str, schema: str, tmp_path: Path) -> None:
    chords, members, chains, steps = 20, 25, 20, 6
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    queue = Queue(dsn, schema=schema)
    queue.migrate()
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    procs = [settings_worker_process(dsn, schema, FAST, log=log, env=env) for log in logs]
    try:
        made_chords = [
            queue.enqueue_workflow(
                chord(
                    group(apps.wf_step.job(c * 100 + m) for m in range(members)),
                    apps.wf_collect.s(),
                )
            )
            for c in range(chords)
        ]
        made_chains = [
            queue.enqueue_workflow(
                chain(apps.wf_step.job(c * 100), *(apps.wf_step.s() for _ in range(steps - 1)))
            )
            for c in range(chains)
        ]
        _wait_all(dsn, schema, chords * (members + 1) + chains * steps)
    finally:
        stop_worker_processes(procs)
        queue.close()
    clean_exit_logs(procs, logs)
    events = _events(runs)
    for c, made in enumerate(made_chords):
        *member_ids, callback = made.job_ids
        last_member_end = max(_ended_once(events[m])[1] for m in member_ids)
        starts = [e for e in events[callback] if e[0] == "start"]
        assert len(starts) == 1, f"chord callback {callback} ran {len(starts)} times"
        assert starts[0][1] > last_member_end, "the callback started before a member ended"
        job = queue.get_job(callback)
        assert job is not None
        assert job.args["values"] == [c * 100 + m + 1 for m in range(members)]
    for c, made in enumerate(made_chains):
        previous_end = 0
        for step, job_id in enumerate(made.job_ids):
            assert _first_start(events[job_id]) > previous_end, "a step started too early"
            _, previous_end = _ended_once(events[job_id])
            # Each step received the one before's result: chain c's step k runs x = 100c + k.
            assert [e[3] for e in events[job_id] if e[0] == "end"] == [c * 100 + step]


def test_a_killed_worker_and_failing_steps_neither_lose_nor_repeat_a_step(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Steps with x % 11 == 5 hang on their first attempt; their worker is killed with
    SIGKILL, the rescuer puts them back after the lease, and the chain goes on. Steps with
    x % 7 == 3 fail once and retry. No step starts before every run of the one before it
    ended, and no attempt of a step runs twice (a step the killed worker had finished but
    not yet written runs again, as any lease job does)."""
    chains, steps = 12, 8
    runs = tmp_path / "runs"
    runs.mkdir()
    hang = tmp_path / "hang"
    hang.touch()
    env = {"PGQUEUE_TEST_RUNS": str(runs), "PGQUEUE_TEST_HANG": str(hang)}
    queue = Queue(dsn, schema=schema)
    queue.migrate()
    logs = [tmp_path / f"worker-{n}.log" for n in range(4)]
    procs = [settings_worker_process(dsn, schema, FAST, log=logs[n], env=env) for n in range(2)]
    log_of = dict(zip(procs, logs, strict=False))
    killed: list[Any] = []
    try:
        made = [
            queue.enqueue_workflow(
                chain(apps.wf_step.job(c * 3), *(apps.wf_step.s() for _ in range(steps - 1)))
            )
            for c in range(chains)
        ]

        def hung() -> set[int]:
            return {job for job, ev in _events(runs).items() if any(e[0] == "hang" for e in ev)}

        wait_until(hung, what="a step hanging on its first attempt")
        hang.unlink()  # no first attempt hangs from now on: only those already hanging
        time.sleep(0.3)  # one that passed the check just before records its hang by now
        with psycopg.connect(dsn) as conn:
            pids = {
                row[0]
                for row in conn.execute(
                    f'SELECT w.pid FROM "{schema}".workers AS w JOIN "{schema}".jobs AS j '
                    "ON j.worker_id = w.id WHERE j.id = ANY(%s)",
                    [sorted(hung())],
                )
            }
        for proc in procs:
            if proc.pid in pids:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                killed.append(proc)
        assert killed
        for n in range(len(killed)):
            replacement = settings_worker_process(dsn, schema, FAST, log=logs[2 + n], env=env)
            log_of[replacement] = logs[2 + n]
            procs.append(replacement)
        procs = [p for p in procs if p not in killed]
        # Each replacement up before the end: one stopped while it starts (the other worker
        # may finish the chains first) dies of the signal before its handlers are set.
        with psycopg.connect(dsn, autocommit=True) as conn:
            for proc in procs:
                wait_until(
                    lambda proc=proc: conn.execute(
                        f'SELECT 1 FROM "{schema}".workers WHERE pid = %s', [proc.pid]
                    ).fetchone(),
                    what=f"worker process {proc.pid} registered",
                )
        _wait_all(dsn, schema, chains * steps)
    finally:
        stop_worker_processes(procs)
        queue.close()
    clean_exit_logs(procs, [log_of[p] for p in procs])
    events = _events(runs)
    rescued = failed = 0
    for chain_made in made:
        previous_end = 0
        for job_id in chain_made.job_ids:
            # Released only once the step before's last run was written: after all its ends.
            assert _first_start(events[job_id]) > previous_end, "a step started too early"
            previous_end = _ended(events[job_id])
            rescued += any(e[0] == "hang" for e in events[job_id])
            failed += any(e[0] == "fail" for e in events[job_id])
    assert rescued >= 1 and failed >= 1


def test_failures_cancel_callbacks_while_other_members_finish_without_deadlocks(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """Each chord has a member that fails and one that succeeds at the same moment on other
    workers: the failure cancels the callback (deleting its edges) while the success settles
    the same callback. Every callback ends cancelled, none runs, and no statement deadlocks
    (a deadlock would be retried, and logged)."""
    chords, members = 150, 6
    runs = tmp_path / "runs"
    runs.mkdir()
    env = {"PGQUEUE_TEST_RUNS": str(runs)}
    queue = Queue(dsn, schema=schema)
    queue.migrate()
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    settings = FAST | {"concurrency": 8}
    procs = [settings_worker_process(dsn, schema, settings, log=log, env=env) for log in logs]
    try:
        made = [
            queue.enqueue_workflow(
                chord(
                    [
                        *(apps.wf_step.job(7 * c + m) for m in range(members - 1)),
                        apps.wf_fail.job(c),
                    ],
                    apps.wf_collect.s(),
                )
            )
            for c in range(chords)
        ]
        with psycopg.connect(dsn) as conn:

            def settled() -> bool:
                done = count(conn, schema, "job_history")
                conn.commit()
                return done == (members + 1) * chords

            wait_until(settled, timeout=240, what="every chord settled")
            assert count(conn, schema, "job_history", "task = 'wf_collect'") == chords
            assert (
                count(conn, schema, "job_history", "task = 'wf_collect' AND status <> 'cancelled'")
                == 0
            )
            for table in ("jobs", "job_deps", "job_waits"):
                assert count(conn, schema, table) == 0, table
    finally:
        stop_worker_processes(procs)
        queue.close()
    outputs = [log.read_text() for log in logs]
    assert not any("Deadlock" in output for output in outputs), [
        line for output in outputs for line in output.splitlines() if "Deadlock" in line
    ][:5]
    callbacks = {m.job_ids[-1] for m in made}
    assert not callbacks & set(_events(runs))  # no callback ever started
