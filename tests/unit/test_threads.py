"""The def handlers' threads (worker/threads.py): at most `size`, started as calls need them;
a shutdown drops the calls not started and lets the threads end."""

from __future__ import annotations

import threading

from pgqueue.worker.threads import Threads


def _threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix + "_")]


def test_calls_beyond_the_size_wait_for_a_thread_instead_of_starting_one() -> None:
    pool = Threads(2, "test-size")
    release, ran = threading.Event(), threading.Semaphore(0)

    def call() -> None:
        ran.release()
        release.wait()

    for _ in range(3):
        pool.submit(call)
    assert sorted(t.name for t in _threads("test-size")) == ["test-size_0", "test-size_1"]
    release.set()
    for _ in range(3):
        assert ran.acquire(timeout=10)
    pool.shutdown()
    for thread in _threads("test-size"):
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_a_shutdown_drops_the_calls_not_started() -> None:
    pool = Threads(1, "test-drop")
    started, release, late = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        started.set()
        release.wait()

    pool.submit(first)
    assert started.wait(timeout=10)
    pool.submit(late.set)
    pool.shutdown()
    release.set()
    (thread,) = _threads("test-drop")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert not late.is_set()
