"""How the `pgqueue` command words counts, durations and schedules."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pgqueue.words import duration, plural, schedule


def test_counts_take_the_plural_only_when_not_one() -> None:
    assert [plural(n, "job") for n in (0, 1, 2, 1200)] == [
        "0 jobs",
        "1 job",
        "2 jobs",
        "1,200 jobs",
    ]
    assert plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"


@pytest.mark.parametrize(
    ("span", "words"),
    [
        (timedelta(days=1), "1 day"),
        (timedelta(days=7), "7 days"),
        (timedelta(days=1, hours=12), "1 day 12 hours"),
        (timedelta(minutes=90), "1 hour 30 minutes"),
        (timedelta(seconds=1), "1 second"),
        (timedelta(seconds=2.5), "2.5 seconds"),
        (timedelta(0), "0 seconds"),
    ],
)
def test_durations_read_as_words_never_as_timedelta_str(span: timedelta, words: str) -> None:
    assert duration(span) == words


@pytest.mark.parametrize(
    ("cron", "every", "zone", "words"),
    [
        (None, timedelta(hours=1), "UTC", "every hour"),
        (None, timedelta(minutes=5), "UTC", "every 5 minutes"),
        (None, timedelta(minutes=90), "UTC", "every 1 hour 30 minutes"),
        ("*/5 * * * *", None, "UTC", "every 5 minutes"),
        ("* * * * *", None, "UTC", "every minute"),
        ("7 * * * *", None, "UTC", "hourly at :07"),
        ("0 6 * * *", None, "UTC", "daily at 06:00 UTC"),
        ("30 9 * * 1", None, "Europe/Riga", "Mondays at 09:30 Europe/Riga"),
        ("0 9 * * 1-5", None, "UTC", "weekdays at 09:00 UTC"),
        ("0 9 15 * *", None, "UTC", "monthly on day 15 at 09:00 UTC"),
        ("0 9 1,15 * *", None, "UTC", "cron 0 9 1,15 * *"),
        ("0 9 1,15 * *", None, "Europe/Riga", "cron 0 9 1,15 * * (Europe/Riga)"),
    ],
)
def test_schedules_read_as_words_where_a_shape_is_common(
    cron: str | None, every: timedelta | None, zone: str, words: str
) -> None:
    assert schedule(cron, every, zone) == words
