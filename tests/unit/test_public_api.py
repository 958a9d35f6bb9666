"""The public API is what __init__ exports; changing it is a decision, so it is pinned."""

import pgqueue

EXPECTED = [
    "AsyncQueue",
    "AsyncTask",
    "Cancellation",
    "Chain",
    "Chord",
    "CitusUnsupportedError",
    "ConcurrencyLimit",
    "ConfigurationError",
    "ConnectionLostError",
    "DatabaseError",
    "DeadMessage",
    "EmbeddedServerError",
    "Enqueued",
    "EnqueuedWorkflow",
    "FairShare",
    "Group",
    "InvalidArgumentsError",
    "Job",
    "JobCancelledError",
    "JobContext",
    "JobFailedError",
    "JobNotFoundError",
    "JobOptions",
    "JobOutcome",
    "JobPage",
    "JobStateError",
    "JobStatus",
    "JobStep",
    "JobSteps",
    "Message",
    "MigrationError",
    "NewJob",
    "OutboxStats",
    "PgQueueError",
    "Queue",
    "QueuePause",
    "RateLimit",
    "RetryPolicy",
    "SignalTimeoutError",
    "Signature",
    "Snooze",
    "StepMismatchError",
    "StepResultError",
    "Task",
    "TaskError",
    "UnknownTaskError",
    "WaitSettings",
    "WaitTimeoutError",
    "Worker",
    "WorkerSettings",
    "WorkerStateError",
    "Workflow",
    "WorkflowJob",
    "chain",
    "chord",
    "group",
]


def test_all_is_sorted_and_pinned() -> None:
    assert pgqueue.__all__ == sorted(pgqueue.__all__)
    assert pgqueue.__all__ == EXPECTED
    for name in pgqueue.__all__:
        assert getattr(pgqueue, name) is not None


def test_every_error_derives_from_pgqueue_error() -> None:
    errors = [getattr(pgqueue, n) for n in pgqueue.__all__ if n.endswith("Error")]
    assert all(issubclass(e, pgqueue.PgQueueError) for e in errors)


def test_drain_returns_a_type_that_pgqueue_testing_exports() -> None:
    import typing

    from pgqueue import testing

    assert "WorkerStats" in testing.__all__
    assert typing.get_type_hints(testing.drain)["return"] is testing.WorkerStats
    assert typing.get_type_hints(testing.adrain)["return"] is testing.WorkerStats
