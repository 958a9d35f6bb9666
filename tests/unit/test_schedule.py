"""Recurring job definitions: validation, tick arithmetic and the decision of one pass."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pgqueue import ConfigurationError, Queue
from pgqueue.schedule import RecurringJob, decide

UTC = timezone.utc


def at(hour: int, minute: int, second: int = 0, day: int = 1, month: int = 1) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


def every_5m(**extra: Any) -> RecurringJob:
    return RecurringJob(name="p", task="t", cron="*/5 * * * *", **extra)


def test_cron_ticks_fall_in_the_half_open_window() -> None:
    p = every_5m()
    assert list(p.ticks(at(10, 0), at(10, 15))) == [at(10, 5), at(10, 10), at(10, 15)]
    assert p.next_after(at(10, 5)) == at(10, 10)
    assert p.next_after(at(10, 4, 59)) == at(10, 5)


def test_latest_tick_at_or_before_includes_an_exact_tick_and_ignores_fractions() -> None:
    p = every_5m()
    assert p.latest_at_or_before(at(10, 5)) == at(10, 5)
    assert p.latest_at_or_before(at(10, 4, 59)) == at(10, 0)
    assert p.latest_at_or_before(at(10, 4, 59) + timedelta(microseconds=500_000)) == at(10, 0)
    assert p.latest_at_or_before(at(10, 5) + timedelta(microseconds=1)) == at(10, 5)


def test_intervals_are_aligned_to_the_unix_epoch() -> None:
    p = RecurringJob(name="p", task="t", every=timedelta(hours=1))
    assert p.next_after(at(10, 17)) == at(11, 0)
    assert p.latest_at_or_before(at(10, 17)) == at(10, 0)
    seven = RecurringJob(name="p", task="t", every=timedelta(seconds=7))
    tick = seven.next_after(at(10, 0))
    assert int(tick.timestamp()) % 7 == 0 and tick > at(10, 0)


def test_cron_in_a_zone_follows_its_daylight_saving_time() -> None:
    p = RecurringJob(name="p", task="t", cron="0 9 * * *", timezone="Europe/Riga")
    assert p.next_after(at(0, 0, day=15, month=1)) == at(7, 0, day=15, month=1)  # UTC+2
    assert p.next_after(at(0, 0, day=15, month=7)) == at(6, 0, day=15, month=7)  # UTC+3


def test_default_grace_is_a_minute_or_the_interval_if_shorter() -> None:
    assert every_5m().effective_grace == timedelta(minutes=1)
    fast = RecurringJob(name="p", task="t", every=timedelta(seconds=10))
    assert fast.effective_grace == timedelta(seconds=10)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "exactly one of cron"),
        ({"cron": "* * * * *", "every": timedelta(minutes=1)}, "exactly one of cron"),
        ({"cron": "@hourly"}, "5 fields"),
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 0 30 2 *"}, "invalid cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": timedelta(milliseconds=1500)}, "whole seconds"),
        ({"every": timedelta(0)}, "whole seconds"),
        ({"every": timedelta(minutes=1), "timezone": "Europe/Riga"}, "timezone applies"),
        ({"every": timedelta(minutes=1), "grace": timedelta(minutes=2)}, "grace="),
        ({"cron": "* * * * *", "missed": "later"}, "missed must be one of"),
    ],
)
def test_bad_definitions_fail_at_registration_naming_the_value(
    options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named):
        RecurringJob(name="p", task="t", **options)


def test_a_pass_on_time_enqueues_the_tick() -> None:
    p = every_5m()
    decided = decide(p, p.definition(), at(10, 0), at(10, 5, 2))
    assert decided.enqueue == [at(10, 5)] and decided.last_tick == at(10, 5)
    assert decided.missed is None and not decided.changed


def test_a_pass_between_ticks_enqueues_nothing_and_keeps_its_place() -> None:
    p = every_5m()
    decided = decide(p, p.definition(), at(10, 5), at(10, 7))
    assert decided.enqueue == [] and decided.last_tick == at(10, 5)


def test_missed_ticks_are_skipped_by_default() -> None:
    p = every_5m()
    decided = decide(p, p.definition(), at(10, 0), at(10, 17))
    assert decided.enqueue == []
    assert decided.missed == (at(10, 5), at(10, 15))
    assert decided.last_tick == at(10, 15)


def test_missed_ticks_run_once_for_the_latest_and_on_time_ticks_still_run() -> None:
    p = every_5m(missed="run_once")
    assert decide(p, p.definition(), at(10, 0), at(10, 17)).enqueue == [at(10, 15)]
    both = decide(p, p.definition(), at(10, 0), at(10, 20, 30))
    assert both.enqueue == [at(10, 15), at(10, 20)] and both.missed == (at(10, 5), at(10, 15))


def test_a_changed_definition_catches_up_nothing_from_before_the_change() -> None:
    p = every_5m(missed="run_once")
    old = p.definition() | {"cron": "*/10 * * * *"}
    decided = decide(p, old, at(10, 0), at(10, 17))
    assert decided.changed and decided.enqueue == [] and decided.missed is None
    on_time = decide(p, old, at(9, 0), at(10, 5, 30))
    assert on_time.enqueue == [at(10, 5)]  # within grace: a change never drops a due tick


def test_queue_periodic_validates_fixed_args_and_returns_the_task() -> None:
    queue = Queue()

    @queue.periodic(every=60, args={"n": 2})
    @queue.task(name="count")
    def count(n: int) -> int:
        return n

    assert count(5) == 5
    (entry,) = list(queue.periodics)
    assert entry.periodic.name == "count" and entry.job.args == {"n": 2}
    with pytest.raises(ConfigurationError, match="defined twice"):
        queue.periodic(count, cron="* * * * *", args={"n": 1})
    queue.periodic("count", cron="0 * * * *", args={"n": 1}, name="count-hourly")
    from pgqueue import InvalidArgumentsError

    with pytest.raises(InvalidArgumentsError):
        queue.periodic(count, every=60, args={"n": "many"}, name="bad")
