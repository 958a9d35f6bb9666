"""A real PgBouncer in transaction pooling mode in front of the test server (bench/pgbouncer.py
starts it). Without Debian's `pgbouncer` package (.ci/run installs it) the tests that need it
skip, saying so."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bench import pgbouncer as bouncer


@contextmanager
def pgbouncer(dsn: str, pool_size: int = 20) -> Iterator[str]:
    """The DSN that reaches `dsn`'s database through PgBouncer, while the block runs."""
    reason = bouncer.unusable(dsn)
    if reason is not None:
        pytest.skip(reason)
    with bouncer.running(dsn, pool_size) as through:
        yield through
