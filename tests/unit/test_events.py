"""The worker's event bus (pgqueue/worker/events.py): what one service publishes reaches the
parts subscribed to its kind, on the worker's event loop, even from a thread of its own."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from pgqueue.worker.events import (
    Bus,
    CancelRequested,
    Event,
    JobsAnnounced,
    JobsClaimable,
    PauseChanged,
    WorkerRevived,
)


def test_an_event_published_from_a_thread_reaches_its_subscriber_on_the_loop() -> None:
    async def main() -> list[tuple[Event, int]]:
        bus = Bus(asyncio.get_running_loop())
        heard: list[tuple[Event, int]] = []
        delivered = asyncio.Event()

        def revived(event: WorkerRevived) -> None:
            heard.append((event, threading.get_ident()))
            delivered.set()  # an asyncio.Event: set from any other thread, the loop never wakes

        bus.subscribe(WorkerRevived, revived)
        thread = threading.Thread(target=bus.publish_threadsafe, args=(WorkerRevived(),))
        thread.start()
        await asyncio.wait_for(delivered.wait(), 30)
        thread.join()
        return heard

    assert asyncio.run(main()) == [(WorkerRevived(), threading.get_ident())]


def test_publish_delivers_at_once_to_the_subscribers_of_its_kind_in_order() -> None:
    async def main() -> list[str]:
        bus = Bus(asyncio.get_running_loop())
        heard: list[str] = []
        bus.subscribe(JobsAnnounced, lambda e: heard.append(f"claimer {e.queue} {e.position}"))
        bus.subscribe(PauseChanged, lambda e: heard.append(f"pause {e.queue} {e.paused}"))
        bus.subscribe(JobsAnnounced, lambda e: heard.append(f"loop {e.queue}"))
        bus.publish(JobsAnnounced("mail", (0, 7)))
        bus.publish(CancelRequested(3))  # nobody subscribed: nobody hears it
        heard.append("published")
        bus.publish(PauseChanged("mail", True))
        return heard

    assert asyncio.run(main()) == [
        "claimer mail (0, 7)",
        "loop mail",
        "published",
        "pause mail True",
    ]


def test_a_subscriber_that_raises_raises_to_the_publisher() -> None:
    def fail(event: JobsClaimable) -> None:
        raise LookupError("subscriber failed")

    async def main() -> None:
        bus = Bus(asyncio.get_running_loop())
        bus.subscribe(JobsClaimable, fail)
        bus.publish(JobsClaimable())

    with pytest.raises(LookupError, match="subscriber failed"):
        asyncio.run(main())


def test_an_event_published_from_a_thread_after_the_loop_closed_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    bus = Bus(loop)
    heard: list[Event] = []
    bus.subscribe(WorkerRevived, heard.append)
    loop.close()
    bus.publish_threadsafe(WorkerRevived())  # the heartbeat's last beat, after the run ended
    assert heard == []


def test_events_are_frozen() -> None:
    event = JobsAnnounced("mail", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.queue = "sms"  # type: ignore[misc]
