"""Fixtures the integration tests of limits and fair shares share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqueue import Queue


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection: each statement a test runs commits at once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def app(queue: Queue) -> Any:
    """The task `t(i)`, returning `i`, on the test's queue."""

    @queue.task(name="t")
    def t(i: int) -> int:
        return i

    return t
