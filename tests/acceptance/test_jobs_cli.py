"""`pgqueue jobs list|show|cancel|retry` as a user meets them: a real process, a real database.

Malformed arguments exit 2 naming the argument; a job that does not exist, or whose state does
not allow the action, exits 1 with one line and no traceback.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from pgqueue import JobContext, Queue, RetryPolicy
from pgqueue.testing import drain
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue


@pytest.fixture
def jobs(dsn: str, schema: str) -> dict[str, int]:
    """One succeeded, one failed, one queued job."""
    queue = Queue(dsn, schema=schema)
    ok = queue.task(name="ok")(lambda: "done")

    @queue.task(name="bad", max_attempts=1, retry=RetryPolicy(base=0))
    def bad() -> None:
        raise RuntimeError("report query timed out")

    made: dict[str, int] = {"succeeded": ok.enqueue(), "failed": bad.enqueue()}
    drain(queue)
    made["queued"] = ok.with_options(queue="later", concurrency_key="acme").enqueue()
    queue.close()
    return made


def jobs_cli(dsn: str, schema: str, *args: str, columns: int = 80) -> str:
    env = {"COLUMNS": str(columns)}
    result = run_pgqueue("jobs", *args, "--dsn", dsn, "--schema", schema, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_jobs_list_shows_live_and_finished_jobs_and_filters(
    dsn: str, schema: str, jobs: dict[str, int]
) -> None:
    narrow, wide = jobs_cli(dsn, schema, "list"), jobs_cli(dsn, schema, "list", columns=160)
    for status in ("succeeded", "failed", "queued"):
        assert status in narrow and status in wide
    assert "report query timed out" in wide
    page = json.loads(jobs_cli(dsn, schema, "list", "--status", "failed,queued", "--json"))
    assert sorted(job["id"] for job in page["jobs"]) == sorted([jobs["failed"], jobs["queued"]])
    assert (
        json.loads(jobs_cli(dsn, schema, "list", "--queue", "later", "--json"))["jobs"][0]["id"]
        == jobs["queued"]
    )
    tenant = json.loads(jobs_cli(dsn, schema, "list", "--tenant", "acme", "--json"))
    assert [job["id"] for job in tenant["jobs"]] == [jobs["queued"]]
    assert "no jobs match" in jobs_cli(dsn, schema, "list", "--key", "nobody")
    assert "no jobs match" in jobs_cli(
        dsn,
        schema,
        "list",
        "--since",
        "2026-01-01T00:00:00+00:00",
        "--until",
        "2026-01-02T00:00:00+00:00",
    )


def test_jobs_list_pages_with_before_id(dsn: str, schema: str, jobs: dict[str, int]) -> None:
    first = json.loads(jobs_cli(dsn, schema, "list", "--limit", "2", "--json"))
    assert len(first["jobs"]) == 2 and first["next_before_id"] is not None
    rest = json.loads(
        jobs_cli(dsn, schema, "list", "--before-id", str(first["next_before_id"]), "--json")
    )
    ids = [job["id"] for job in first["jobs"] + rest["jobs"]]
    assert ids == sorted(jobs.values(), reverse=True)
    assert "more: --before-id" in jobs_cli(dsn, schema, "list", "--limit", "1")


def test_jobs_show_prints_the_record_with_its_error(
    dsn: str, schema: str, jobs: dict[str, int]
) -> None:
    text = jobs_cli(dsn, schema, "show", str(jobs["failed"]))
    assert "failed" in text and "RuntimeError: report query timed out" in text
    assert "Traceback" in text  # the job's own, recorded traceback
    record = json.loads(jobs_cli(dsn, schema, "show", str(jobs["succeeded"]), "--json"))
    assert record["status"] == "succeeded" and record["result"] == "done"
    assert record["run_time"] is not None


def test_jobs_show_prints_a_durable_job_s_steps_and_what_it_waits_for_in_80_columns(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)

    @queue.task(name="durable")
    def durable(ctx: JobContext) -> None:
        ctx.step("a step whose name is rather long, to be cut", lambda: {"text": "x" * 200})
        ctx.sleep(timedelta(days=1), name="a day")

    @queue.task(name="parked")
    def parked(ctx: JobContext) -> None:
        ctx.wait_for_signal("order-7-approval")

    sleeper, waiter = durable.enqueue(), parked.enqueue()
    plain = queue.task(name="plain")(lambda: None).enqueue()
    drain(queue)
    queue.close()
    text = jobs_cli(dsn, schema, "show", str(sleeper))
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "sleeping until" in text and "a day" in text and "recorded" in text
    assert "…" in text  # the long name and result are cut, not wrapped
    record = json.loads(jobs_cli(dsn, schema, "show", str(sleeper), "--json"))
    steps = record["steps"]["steps"]
    assert [s["state"] for s in steps] == ["recorded", "sleep"]
    assert steps[0]["result"] == {"text": "x" * 200}  # whole
    assert record["steps"]["sleeping_until"] is not None
    text = jobs_cli(dsn, schema, "show", str(waiter))
    assert "signal 'order-7-approval', no timeout" in text and "seq" not in text
    assert "steps" not in json.loads(jobs_cli(dsn, schema, "show", str(plain), "--json"))


def test_jobs_cancel_and_retry_change_the_jobs(dsn: str, schema: str, jobs: dict[str, int]) -> None:
    assert "cancelled" in jobs_cli(dsn, schema, "cancel", str(jobs["queued"]))
    assert "already finished" in jobs_cli(dsn, schema, "cancel", str(jobs["queued"]))
    out = jobs_cli(dsn, schema, "retry", str(jobs["failed"]))
    retry_id = int(out.split()[-1])
    record = json.loads(jobs_cli(dsn, schema, "show", str(retry_id), "--json"))
    assert record["retry_of"] == jobs["failed"] and record["status"] == "queued"


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("show", "abc"), ["argument ID", "'abc' is not a job id"]),
        (("cancel", "0"), ["argument ID", "0 is not a job id"]),
        (("list", "--status", "done"), ["argument --status", "'done' is not a job status"]),
        (("list", "--limit", "5000"), ["--limit 5000 is over 1000"]),
        (("list", "--since", "yesterday"), ["argument --since", "'yesterday' is not an age"]),
        (("list", "--since", "2026-01-01T00:00"), ["argument --since", "with an offset"]),
        (("list", "--queue", "a b"), ["argument --queue", "invalid queue name"]),
        (("frobnicate",), ["invalid choice"]),
    ],
)
def test_malformed_jobs_arguments_exit_2_naming_them(
    dsn: str, schema: str, args: tuple[str, ...], fragments: list[str]
) -> None:
    result = run_pgqueue("jobs", *args, "--dsn", dsn, "--schema", schema)
    assert_usage_error(result, *fragments)


@pytest.mark.parametrize(
    ("action", "which", "message"),
    [
        ("show", None, "no job has id 99999999"),
        ("cancel", None, "no job has id 99999999"),
        ("retry", "succeeded", "only failed or cancelled jobs can be retried"),
    ],
)
def test_impossible_job_actions_exit_1_with_one_line(
    dsn: str, schema: str, jobs: dict[str, int], action: str, which: str | None, message: str
) -> None:
    job_id = str(jobs[which]) if which else "99999999"
    result = run_pgqueue("jobs", action, job_id, "--dsn", dsn, "--schema", schema)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_jobs_workflow_shows_each_job_and_what_it_waits_for(dsn: str, schema: str) -> None:
    from pgqueue import chain

    queue = Queue(dsn, schema=schema)
    step = queue.task(name="step")(lambda x: x + 1)
    flow = queue.enqueue_workflow(
        chain(step.with_options(tags=["nightly"]).job(1), step.s(), step.s())
    )
    queue.close()
    first, second, third = flow.job_ids
    table = jobs_cli(dsn, schema, "workflow", str(flow.id), columns=120)
    assert f"workflow {flow.id}: 3 jobs, running (2 blocked, 1 queued)" in table
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
    assert rows[str(second)][1] == "blocked" and rows[str(second)][-1] == str(first)
    assert rows[str(third)][-1] == str(second)
    shown = json.loads(jobs_cli(dsn, schema, "workflow", str(flow.id), "--json"))
    assert [j["status"] for j in shown["jobs"]] == ["queued", "blocked", "blocked"]
    assert shown["finished"] is False
    tagged = json.loads(jobs_cli(dsn, schema, "list", "--tag", "nightly", "--json"))
    assert [j["id"] for j in tagged["jobs"]] == [first]
    members = json.loads(jobs_cli(dsn, schema, "list", "--workflow", str(flow.id), "--json"))
    assert sorted(j["id"] for j in members["jobs"]) == [first, second, third]
    status = json.loads(run_pgqueue("status", "--json", "--dsn", dsn, "--schema", schema).stdout)
    assert [(q["queue"], q["queued"], q["blocked"]) for q in status["queues"]] == [
        ("default", 1, 2)
    ]
    assert "blocked" in run_pgqueue("status", "--dsn", dsn, "--schema", schema).stdout
    missing = run_pgqueue("jobs", "workflow", "999999", "--dsn", dsn, "--schema", schema)
    assert missing.returncode == 1 and "no workflow has id 999999" in missing.stderr
    assert "Traceback" not in missing.stderr
