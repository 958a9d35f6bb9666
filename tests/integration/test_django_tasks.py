"""pgqueue.contrib.django.Backend, the django.tasks backend, in a real Django 6 project
(tests/django_project) with real worker processes: the cases Django's own backend tests
exercise (results, errors and tracebacks, async tasks, context, priority, run_after, the
signals), the result API through each status, and the job joining the caller's atomic()
block. tests/django_project/tasks_scenarios.py drives it; this judges what it saw."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from pgqueue import Queue
from tests.conftest import ROOT, database_of_its_own, run_python

pytest.importorskip(
    "django.tasks",
    reason="django.tasks needs Django 6, which needs Python 3.12: .ci/run runs this file "
    "in .venv-django (make test-django)",
)

PROJECT = ROOT / "tests" / "django_project"


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


@pytest.fixture(scope="module")
def seen(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One run of the scenarios, on a database of their own, judged by each test here."""
    with database_of_its_own(dsn) as database:
        env = {
            "DJANGO_TEST_DSN": database,
            "PYTHONPATH": f"{ROOT}:{PROJECT}",
            "SIGNAL_LOG": str(tmp_path_factory.mktemp("signals") / "signals.jsonl"),
        }
        migrated = run_python("manage.py", "migrate", "--noinput", cwd=PROJECT, env=env)
        assert migrated.returncode == 0, migrated.stderr
        # The scenarios and their workers run with a broken alias of no use in TASKS.
        env["DJANGO_TASKS_BROKEN_ALIAS"] = "1"
        ran = run_python("tasks_scenarios.py", cwd=PROJECT, env=env, timeout=300)
        assert ran.returncode == 0, ran.stderr
        yield dict(json.loads(ran.stdout))


def test_the_job_is_the_atomic_blocks(seen: dict[str, Any]) -> None:
    assert seen["inside_block"] == "READY"  # read back on the same connection
    assert seen["rolled_back_missing"] is True
    assert seen["savepoint_missing"] is True
    assert seen["outer_status"] == "READY"
    # Committed once, run once: only the committed orders were marked.
    assert seen["after_burst"]["committed"] == "SUCCESSFUL"
    assert seen["after_burst"]["outer"] == "SUCCESSFUL"
    assert seen["after_burst"]["orders_sent"] == ["jam", "tea"]


def test_bad_input_is_refused_and_nothing_is_stored(seen: dict[str, Any]) -> None:
    refused = seen["refused"]
    assert refused["non_json"].startswith("TypeError: Unsupported type")  # Django's own check
    assert refused["wrong_type"].startswith("InvalidArgumentsError:")  # annotated: int
    assert "valid integer" in refused["wrong_type"]
    assert refused["too_many"].startswith("InvalidArgumentsError:")
    assert "too many positional arguments" in refused["too_many"]
    assert refused["nul"].startswith("InvalidArgumentsError:")
    assert "NUL character" in refused["nul"]
    assert refused["nan"].startswith("InvalidArgumentsError:")
    assert refused["unknown_queue"] == ("InvalidTask: Queue 'nowhere' is not valid for backend.")
    assert refused["priority"].startswith("InvalidTask: priority must be a whole number")
    assert refused["naive_run_after"] == "InvalidTask: run_after must be an aware datetime."
    assert seen["missing"] == {
        "not_a_number": True,
        "no_such_job": True,
        "a_plain_pgqueue_job": True,
    }
    assert seen["result_api_mismatch"].startswith("TaskResultMismatch: Task does not match")


def test_a_job_naming_anything_else_fails_and_runs_nothing(seen: dict[str, Any]) -> None:
    # Outside the installed apps nothing is imported; inside, only a pgqueue-backed @task runs.
    for name in ("os.system", "shop.models.Order", "shop.tasks.no_such_task"):
        status, error = seen["strangers"][name]
        assert status == "failed", name
        assert error.startswith(f"UnknownTaskError: no task is registered under {name!r}")


def test_a_broken_alias_of_no_use_stops_no_enqueue(seen: dict[str, Any]) -> None:
    # TASKS had "missing": {"BACKEND": "does.not.exist"} in the scenarios and their workers:
    # every enqueue and job went through, and the alias fails only when used, as Django has it.
    assert seen["inside_block"] == "READY"
    assert seen["missing_alias"] == (
        "Could not find backend 'does.not.exist': No module named 'does'"
    )


def test_task_enqueued_is_sent_when_the_job_commits_never_on_rollback(
    seen: dict[str, Any],
) -> None:
    assert seen["task_enqueued_sent"] == {
        "inside_the_block": 0,
        "after_its_commit": 1,
        "rolled_back": 0,
        "savepoint_rolled_back": 0,
        "outer_committed": 1,
        "autocommit": 1,
    }


def test_attempts_count_finished_attempts_and_context_the_current_one(
    seen: dict[str, Any],
) -> None:
    # TaskResult.attempts leaves out the attempt running; TaskContext.attempt is its number.
    assert seen["signals"]["fails_once"] == [
        ["task_enqueued", "READY", 0, []],
        ["task_started", "RUNNING", 0, []],
        ["task_finished", "READY", 1, ["builtins.RuntimeError"]],
        ["task_started", "RUNNING", 1, []],
        ["task_finished", "SUCCESSFUL", 2, []],
    ]
    assert seen["cases"]["fails_once"]["return_value"] == 2  # context.attempt on the retry
    assert seen["cases"]["context"]["return_value"] == 1


def test_started_at_is_the_first_attempts_start_across_retries(seen: dict[str, Any]) -> None:
    times = seen["fails_once_times"]
    started = [(at(s), at(a)) for name, s, a in times["signals"] if name == "task_started"]
    (first_start, first_last), (second_start, second_last) = started
    assert first_start == first_last  # attempt 1: its own start
    assert second_start == first_start  # attempt 2: still the first attempt's
    assert second_last > first_last  # last_attempted_at: the latest attempt's
    result_started, result_last = (at(t) for t in times["result"])
    assert result_started == first_start
    assert result_last > result_started


def test_priority_and_run_after(seen: dict[str, Any]) -> None:
    assert seen["higher_priority_started_first"] is True
    meaning = seen["cases"]["meaning"]
    assert (meaning["queue_name"], meaning["priority"]) == ("mail", 10)
    # Due in an hour: still waiting when the worker stopped, with its run_after intact.
    assert seen["deferred"] == {"status": "READY", "run_after_kept": True}


def test_the_result_api_reports_each_status(seen: dict[str, Any]) -> None:
    assert seen["ready_before_worker"] == "READY"
    assert seen["aget_result"] == "READY"
    assert seen["running"] == {
        "status": "RUNNING",
        "started": True,
        "attempts": 0,  # Django: "If the task is currently running, it does not count"
        "return_value_error": "Task has not finished yet",
    }
    gated = seen["gated"]
    assert gated["status"] == "SUCCESSFUL"
    assert gated["return_value"].endswith("/open")
    assert gated["times_in_order"] is True
    assert seen["worker_exit"] == 0


def test_results_errors_and_tracebacks(seen: dict[str, Any]) -> None:
    cases = seen["cases"]
    noop = cases["noop"]
    assert (noop["status"], noop["args"], noop["kwargs"]) == ("SUCCESSFUL", [1], {"two": 3})
    assert noop["return_value"] is None and noop["attempts"] == 1 and noop["times_in_order"]
    assert cases["noop_async"]["status"] == "SUCCESSFUL"
    assert cases["meaning"]["return_value"] == 42
    assert seen["task_id_matches"] is True
    assert cases["context"]["return_value"] == 1

    for name, kind, message in [
        ("value_error", "builtins.ValueError", "This task failed due to ValueError"),
        ("system_exit", "builtins.SystemExit", "This task failed due to SystemExit"),
    ]:
        case = cases[name]
        assert case["status"] == "FAILED", name
        assert case["return_value_error"] == "Task failed"
        assert case["errors"] == [kind]
        assert case["tracebacks"][0].endswith(f"{kind.split('.')[1]}: {message}\n")
        assert case["times_in_order"] is True
    complex_exception = cases["complex_exception"]
    assert complex_exception["errors"] == ["builtins.ValueError"]
    assert 'ValueError(ValueError("This task failed"))' in complex_exception["tracebacks"][0]
    unstorable = cases["complex_return_value"]
    assert unstorable["status"] == "FAILED"
    assert unstorable["errors"] == ["builtins.TypeError"]
    assert "Unsupported type" in unstorable["tracebacks"][0]

    # wait_result heard each of those finish; on a job not due it times out, naming it.
    assert seen["deferred_wait"] == {"timed_out": True, "job_ids": [int(seen["deferred_id"])]}

    retried = cases["fails_once"]  # a backend with MAX_ATTEMPTS 2
    assert retried["status"] == "SUCCESSFUL"
    assert retried["return_value"] == 2
    assert retried["attempts"] == 2
    assert retried["errors"] == ["builtins.RuntimeError"]


def test_signals_in_the_enqueuing_process_and_the_worker(seen: dict[str, Any]) -> None:
    signals = seen["signals"]
    assert seen["signal_sender"] == ["Backend"]
    assert signals["meaning"] == [
        ["task_enqueued", "READY", 0, []],
        ["task_started", "RUNNING", 0, []],
        ["task_finished", "SUCCESSFUL", 1, []],
    ]
    assert signals["value_error"] == [
        ["task_enqueued", "READY", 0, []],
        ["task_started", "RUNNING", 0, []],
        ["task_finished", "FAILED", 1, ["builtins.ValueError"]],
    ]
    assert signals["complex_return_value"][-1] == [
        "task_finished",
        "FAILED",
        1,
        ["builtins.TypeError"],
    ]
    assert signals["noop_async"][-1] == ["task_finished", "SUCCESSFUL", 1, []]


@pytest.mark.parametrize("debug", ["1", "0"], ids=["debug", "no-debug"])
def test_the_worker_command_prints_each_django_tasks_line_once(
    own_database: str, debug: str
) -> None:
    """With DEBUG on, Django's default logging has a console handler of its own for django.*
    records; the worker's stderr handler must not print them again."""
    env = {
        "DJANGO_TEST_DSN": own_database,
        "PYTHONPATH": f"{ROOT}:{PROJECT}",
        "DJANGO_DEBUG": debug,
    }
    migrated = run_python("manage.py", "migrate", "--noinput", cwd=PROJECT, env=env)
    assert migrated.returncode == 0, migrated.stderr
    enqueue = (
        "from shop import tasks; "
        "print(tasks.noop_task.enqueue().id, tasks.failing_task_value_error.enqueue().id)"
    )
    enqueued = run_python("manage.py", "shell", "-v", "0", "-c", enqueue, cwd=PROJECT, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    ok, failing = enqueued.stdout.split()

    worked = run_python("manage.py", "pgqueue_worker", "--burst", cwd=PROJECT, env=env)
    assert worked.returncode == 0, worked.stderr
    lines = worked.stderr.splitlines()

    def count(pattern: str) -> int:
        return sum(1 for line in lines if re.search(pattern, line))

    assert count(rf"Task id={ok} path=shop\.tasks\.noop_task state=RUNNING$") == 1, lines
    assert count(rf"Task id={ok} path=shop\.tasks\.noop_task state=SUCCESSFUL$") == 1, lines
    assert count(rf"Task id={failing} path=\S+ state=RUNNING$") == 1, lines
    assert count(rf"Task id={failing} path=\S+ state=FAILED$") == 1, lines
    assert count(r"^Traceback \(most recent call last\)") == 1, lines  # django.tasks' ERROR
    assert count(r"INFO pgqueue\.worker: worker \d+ started") == 1, lines  # the worker's own


@pytest.fixture
def project(own_database: str) -> dict[str, str]:
    """The Django project, migrated, on a database of the test's own: its environment."""
    env = {"DJANGO_TEST_DSN": own_database, "PYTHONPATH": f"{ROOT}:{PROJECT}"}
    migrated = run_python("manage.py", "migrate", "--noinput", cwd=PROJECT, env=env)
    assert migrated.returncode == 0, migrated.stderr
    return env


def _enqueue_on_mail(env: dict[str, str]) -> int:
    """A django.tasks job on the `mail` queue (calculate_meaning_of_life's): its id."""
    enqueue = "from shop import tasks; print(tasks.calculate_meaning_of_life.enqueue().id)"
    enqueued = run_python("manage.py", "shell", "-v", "0", "-c", enqueue, cwd=PROJECT, env=env)
    assert enqueued.returncode == 0, enqueued.stderr
    return int(enqueued.stdout)


def _job(dsn: str, job_id: int) -> tuple[str, Any]:
    """The job's status and result, wherever it is now."""
    queue = Queue(dsn)
    try:
        job = queue.get_job(job_id)
    finally:
        queue.close()
    assert job is not None, job_id
    return job.status.value, job.result


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line.lower()]


def test_the_worker_command_with_queues_all_runs_a_task_on_another_queue(
    own_database: str, project: dict[str, str]
) -> None:
    job_id = _enqueue_on_mail(project)
    worked = run_python(
        *("manage.py", "pgqueue_worker", "--queues", "all", "--burst"),
        *("--settings", "settings", "--pythonpath", ".", "--verbosity", "1"),
        cwd=PROJECT,
        env=project,
    )
    assert worked.returncode == 0, worked.stderr
    # The tasks' queues (default, mail) and the one only TASKS lists (retries).
    assert "queues=default,mail,retries " in worked.stderr
    assert _warnings(worked.stderr) == []
    assert _job(own_database, job_id) == ("succeeded", 42)


def test_the_worker_command_warns_only_of_the_queues_it_does_not_serve(
    own_database: str, project: dict[str, str]
) -> None:
    job_id = _enqueue_on_mail(project)
    default_only = run_python(
        *("manage.py", "pgqueue_worker", "--queues", "default", "--burst", "--verbosity", "0"),
        cwd=PROJECT,
        env=project,
    )
    assert default_only.returncode == 0, default_only.stderr
    assert "worker 1 started" not in default_only.stderr  # verbosity 0: warnings only
    assert _warnings(default_only.stderr) == [
        line for line in default_only.stderr.splitlines() if "queue 'mail'" in line
    ]
    assert (
        "task 'shop.tasks.calculate_meaning_of_life' runs on queue 'mail', which this worker "
        "does not serve: its jobs wait for a worker started with --queues mail"
    ) in default_only.stderr
    assert _job(own_database, job_id) == ("queued", None)

    # Both queues named: no word of an unknown queue, nor of an unserved one.
    both = run_python(
        *("manage.py", "pgqueue_worker", "--queues", "default,mail", "--burst"),
        cwd=PROJECT,
        env=project,
    )
    assert both.returncode == 0, both.stderr
    assert "queues=default,mail " in both.stderr
    assert _warnings(both.stderr) == []
    assert _job(own_database, job_id) == ("succeeded", 42)


def test_the_worker_command_reports_errors_as_management_commands_do(
    project: dict[str, str],
) -> None:
    bad = ("manage.py", "pgqueue_worker", "--burst", "--dsn", "not a dsn")
    plain = run_python(*bad, cwd=PROJECT, env=project)
    assert plain.returncode == 2
    assert "CommandError: invalid DSN" in plain.stderr
    assert "Traceback" not in plain.stderr
    traced = run_python(*bad, "--traceback", cwd=PROJECT, env=project)
    assert traced.returncode != 0
    assert "Traceback (most recent call last)" in traced.stderr
    assert "CommandError: invalid DSN" in traced.stderr
