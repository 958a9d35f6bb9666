"""How pgqueue words counts, durations and schedules for people: the command and the dashboard
say them the same way. Plain text, no rich."""

from __future__ import annotations

from datetime import timedelta

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60))
_WEEKDAYS = {
    "0": "Sunday",
    "1": "Monday",
    "2": "Tuesday",
    "3": "Wednesday",
    "4": "Thursday",
    "5": "Friday",
    "6": "Saturday",
    "7": "Sunday",
    "1-5": "weekdays",
}


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 job`, `2 jobs`, `1,200 jobs`; `many` for nouns that take more than an s."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"


def duration(span: timedelta) -> str:
    """A duration in words, exactly: `1 day`, `1 day 12 hours`, `1 hour 30 minutes`, `2.5
    seconds`."""
    seconds = span.total_seconds()
    parts = []
    for unit, size in _UNITS:
        whole = int(seconds // size)
        if whole:
            parts.append(plural(whole, unit))
            seconds -= whole * size
    if seconds or not parts:
        shown = round(seconds, 3)
        parts.append(f"{shown:g} second" + ("" if shown == 1 else "s"))
    return " ".join(parts)


def age(span: timedelta | None) -> str:
    """A duration in a table cell: 4.2s, 3m12s, 2h05m, 3d04h; `-` for none."""
    if span is None:
        return "-"
    seconds = span.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def schedule(cron: str | None, every: timedelta | None, zone: str = "UTC") -> str:
    """A recurring job's schedule: `every 5 minutes`, `daily at 06:00 UTC`, `Mondays at
    09:30 Europe/Riga`; a cron expression of another shape as itself, `cron 0 9 1,15 * *`."""
    if every is not None:
        text = duration(every)
        single = text.startswith("1 ") and " " not in text[2:]
        return "every " + (text[2:] if single else text)  # `every hour`, not `every 1 hour`
    assert cron is not None
    minute, hour, day, month, weekday = cron.split()
    steps = {"*": "every minute", "*/1": "every minute"}
    if (hour, day, month, weekday) == ("*", "*", "*", "*"):
        if minute in steps:
            return steps[minute]
        if minute.startswith("*/") and minute[2:].isdigit():
            return f"every {minute[2:]} minutes"
        if minute.isdigit():
            return f"hourly at :{int(minute):02d}"
    if minute.isdigit() and hour.isdigit() and month == "*":
        at = f"at {int(hour):02d}:{int(minute):02d} {zone}"
        if (day, weekday) == ("*", "*"):
            return f"daily {at}"
        if day == "*" and weekday in _WEEKDAYS:
            days = _WEEKDAYS[weekday]
            return f"{days} {at}" if days == "weekdays" else f"{days}s {at}"
        if weekday == "*" and day.isdigit():
            return f"monthly on day {int(day)} {at}"
    return f"cron {cron} ({zone})" if zone != "UTC" else f"cron {cron}"
