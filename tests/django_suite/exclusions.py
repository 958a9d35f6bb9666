"""The tests of Django's tests/tasks that cannot apply to pgqueue's backend, each with why:
the one place any is left out (plugin.py skips them with this reason, and fails the run if
one no longer exists). Keyed "file::class::test"."""

_SYNC_READ_IN_ASYNC = (
    "calls the synchronous {call} inside an async test: Django refuses a database backend's "
    "synchronous queries there (SynchronousOnlyOperation) and documents {twin} for async "
    "code; DummyBackend keeps its results in memory, so only it can answer"
)

_SET_IN_MEMORY = (
    "sets a status on the result object DummyBackend keeps in memory and expects refresh() "
    "to read it back; pgqueue's backend reads results from the database, where the job is "
    "still READY"
)

EXCLUDED: dict[str, str] = {
    "test_tasks.py::TaskTestCase::test_get_missing_result": _SYNC_READ_IN_ASYNC.format(
        call="Task.get_result()", twin="aget_result()"
    ),
    "test_tasks.py::TaskTestCase::test_refresh_result": _SYNC_READ_IN_ASYNC.format(
        call="TaskResult.refresh()", twin="arefresh()"
    ),
    "test_tasks.py::TaskTestCase::test_using_correct_backend": (
        "asserts the backend is an instance of Django's DummyBackend class"
    ),
    "test_tasks.py::TaskTestCase::test_get_backend": (
        "asserts the backends are instances of Django's DummyBackend and ImmediateBackend classes"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_using_correct_backend": (
        "asserts the backend is an instance of Django's DummyBackend class, with no OPTIONS"
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_get_missing_result": (
        _SYNC_READ_IN_ASYNC.format(call="backend.get_result()", twin="aget_result()")
    ),
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result": _SET_IN_MEMORY,
    "test_dummy_backend.py::DummyBackendTestCase::test_refresh_result_async": _SET_IN_MEMORY,
    "test_dummy_backend.py::DummyBackendTransactionTestCase"
    "::test_doesnt_wait_until_transaction_commit_by_default": (
        "enqueues with no installed app (available_apps = []), where pgqueue refuses a task "
        "no worker would run, and counts the job in `results` inside the enqueuing "
        "transaction, which pgqueue's `results`, read on a connection of its own, sees only "
        "once that transaction commits (the point of a transactional queue)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_using_correct_backend": (
        "asserts the backend is an instance of Django's ImmediateBackend class, with no OPTIONS"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_get_result": (
        "asserts get_result is unsupported, as in ImmediateBackend; pgqueue's backend "
        "supports it (supports_get_result = True)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_refresh_result": (
        "asserts refresh is unsupported, as in ImmediateBackend; pgqueue's backend supports it "
        "(supports_get_result = True)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_cannot_pass_run_after": (
        "asserts run_after is refused, as in ImmediateBackend; pgqueue's backend supports it "
        "(supports_defer = True)"
    ),
    "test_immediate_backend.py::ImmediateBackendTestCase::test_throws_keyboard_interrupt": (
        "expects the task's KeyboardInterrupt to reach the caller of enqueue(), which runs the "
        "task itself in ImmediateBackend; a database backend's task runs in a worker, where a "
        "handler's KeyboardInterrupt fails the job, never its enqueuer"
    ),
    "test_immediate_backend.py::ImmediateBackendTransactionTestCase"
    "::test_doesnt_wait_until_transaction_commit_by_default": (
        "expects the task to run inside the enqueuing transaction; pgqueue's job is part of "
        "that transaction, so no worker can see it before the commit (the point of a "
        "transactional queue)"
    ),
}
