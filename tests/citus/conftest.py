"""Fixtures of the Citus suite: one local cluster per session (cluster.py), a schema laid out
with `migrate --citus` per test. Skips, saying why, where Citus is not installed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.citus import cluster


@pytest.fixture(scope="session")
def citus() -> Iterator[cluster.Cluster]:
    why = cluster.installed()
    if why:
        pytest.skip(f"Citus is not available: {why}")
    with cluster.running(nodes=2) as running:
        yield running
