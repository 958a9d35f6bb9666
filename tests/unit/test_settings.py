"""Impossible settings fail at construction, naming the setting and the rule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pgqueue import ConfigurationError, JobOptions, Queue, RetryPolicy, WorkerSettings


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 10_001}, "concurrency"),
        ({"batch_size": 0}, "batch_size"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"poll_interval": -1}, "poll_interval"),
        ({"shutdown_grace": -0.5}, "shutdown_grace"),
        ({"claim_cooldown": -0.001}, "claim_cooldown"),
        ({"claim_cooldown": 1.5}, "claim_cooldown"),
        ({"hint_reset_jitter": 1.5}, "hint_reset_jitter"),
        ({"queues": ()}, "queues"),
        ({"queues": ("ok", "ok")}, "queues"),
        ({"queues": ("bad name!",)}, "queues"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_impossible_worker_settings_name_the_setting(fields: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError, match=names):
        WorkerSettings(**fields)


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"delay": timedelta(seconds=-1)}, "delay"),
        ({"delay": -5}, "delay"),
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"queue": ""}, "queue"),
        ({"queue": "x'; DROP TABLE jobs; --"}, "queue"),
    ],
)
def test_impossible_job_options_name_the_option(fields: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError, match=names):
        JobOptions(**fields)


def test_naive_run_at_is_refused() -> None:
    from datetime import datetime

    with pytest.raises(ConfigurationError, match="timezone-aware"):
        JobOptions(run_at=datetime(2030, 1, 1))


@pytest.mark.parametrize("schema", ['x"; DROP SCHEMA public; --', "has space", "1starts_digit", ""])
def test_hostile_or_invalid_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        Queue(schema=schema)


def test_retry_delay_grows_exponentially_with_bounded_jitter() -> None:
    policy = RetryPolicy(base=timedelta(seconds=2), cap=timedelta(seconds=60), jitter=0.25)
    for attempt, expected in [(1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (30, 60)]:
        for _ in range(50):
            delay = policy.delay(attempt).total_seconds()
            assert expected * 0.75 <= delay <= expected * 1.25, (attempt, delay)


def test_retry_policy_without_jitter_is_exact() -> None:
    policy = RetryPolicy(base=1, jitter=0)
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3)] == [1, 2, 4]
