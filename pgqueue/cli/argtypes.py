"""Argument types for the `pgqueue` command: a malformed value is an argparse error (exit 2)
that names the option and says what is allowed."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from pgqueue.errors import ConfigurationError
from pgqueue.models import ALL_QUEUES, QUEUE_NAME, SCHEMA_NAME, check_identifier


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not {least} or more")
    return value


def non_negative_int(text: str) -> int:
    return _whole(text, 0)


def positive_int(text: str) -> int:
    return _whole(text, 1)


def port(text: str) -> int:
    value = _whole(text, 1)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def processes(text: str) -> int | str:
    """A count of worker processes, or `auto` (resolved where it is used: the cores)."""
    if text == "auto":
        return text
    try:
        return _whole(text, 1)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of processes: give 1 or more, or auto"
        ) from None


def role_name(text: str) -> str:
    if not 1 <= len(text) <= 63 or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a role name (1-63 characters)")
    return text  # quoted as an identifier by psycopg.sql, whatever it contains


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of 0 or more")
    return value


_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def duration(text: str) -> timedelta:
    """90s, 10m, 1h, 1h30m, 1h30m15s, 7d, 1d12h, or plain seconds (90, 2.5)."""
    try:
        if _SECONDS.fullmatch(text):
            return timedelta(seconds=float(text))
        match = _DURATION.fullmatch(text)
        if match and any(match.groups()):
            days, hours, minutes, seconds = (float(part or 0) for part in match.groups())
            return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError:
        pass
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a duration such as 90s, 10m, 1h, 1h30m, 7d or a number of seconds"
    )


def queues(text: str) -> tuple[str, ...]:
    """Comma-separated queue names, or `all` (also `*`): every queue the application knows."""
    if text.strip() in ("all", ALL_QUEUES):
        return (ALL_QUEUES,)
    names = tuple(name.strip() for name in text.split(","))
    for name in names:
        queue_name(name)
    return names


def _name(kind: str, text: str, pattern: re.Pattern[str]) -> str:
    try:
        return check_identifier(kind, text, pattern)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def schema(text: str) -> str:
    return _name("schema", text, SCHEMA_NAME)


def job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a whole number)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a job id (1 or more)")
    return value


def _some_of(text: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(","))
    for name in chosen:
        if name not in allowed:
            raise argparse.ArgumentTypeError(
                f"{name!r} is not {what}; use one or more of {', '.join(allowed)}"
            )
    return chosen


def statuses(text: str) -> tuple[str, ...]:
    """Comma-separated job statuses."""
    from pgqueue.models import JobStatus

    return _some_of(text, [s.value for s in JobStatus], "a job status")


def moment(text: str) -> datetime:
    """A time: an age back from now (90s, 10m, 1h30m) or an ISO 8601 time with its offset."""
    try:
        return datetime.now(timezone.utc) - duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        return iso_time(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age such as 10m or 2h, nor an ISO 8601 time with an offset "
            "such as 2026-11-23T09:00:00+00:00"
        ) from None


def iso_time(text: str) -> datetime:
    """An ISO 8601 time with its offset: a command line has no timezone to assume."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time with an offset, such as 2026-11-23T09:00:00+00:00"
        )
    return value


def json_value(text: str) -> object:
    """Any JSON value: a signal's payload."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {exc}") from None


def json_arguments(text: str) -> list[object] | dict[str, object]:
    """A task's arguments: a JSON array (by position) or object (by name)."""
    value = json_value(text)
    if not isinstance(value, (list, dict)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is a single JSON value: give an array of the arguments by "
            'position, [1, "a"], or an object of them by name, {"x": 1}'
        )
    return value


def json_object(text: str) -> dict[str, object]:
    """A task's arguments by name: a JSON object."""
    value = json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'{text!r} is not a JSON object of the arguments by name, such as {{"x": 1}}'
        )
    return value


def queue_name(text: str) -> str:
    return _name("queue", text, QUEUE_NAME)


def final_statuses(text: str) -> tuple[str, ...]:
    """Comma-separated statuses a finished job can have."""
    from pgqueue.history.retention import FINAL_STATUSES

    return _some_of(text, FINAL_STATUSES, "a finished status")
