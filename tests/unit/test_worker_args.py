"""A Worker is built from the application's queue; anything else is a clear error."""

from __future__ import annotations

import pytest

from pgqueue import ConfigurationError, Queue, Worker


@pytest.mark.parametrize("given", ["myapp.jobs:queue", None, object()])
def test_a_worker_of_something_that_is_not_a_queue_is_refused(given: object) -> None:
    with pytest.raises(ConfigurationError, match="Queue or AsyncQueue"):
        Worker(given, dsn="postgresql://")  # type: ignore[arg-type]


def test_a_worker_takes_the_queues_schema_unless_told_another() -> None:
    queue = Queue(schema="shop")
    assert Worker(queue, dsn="postgresql://").schema == "shop"
    assert Worker(queue, dsn="postgresql://", schema="other").schema == "other"
