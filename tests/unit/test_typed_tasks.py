"""Typed tasks: a type checker sees a task's parameters (Task[P, R]; for a handler taking a
JobContext first, those after it) and an enqueue's options (EnqueueOptions), so wrong
arguments are mypy errors before they are InvalidArgumentsErrors; and what a job returns, so
`queue.wait(...)` on its id (an Enqueued[T]) is of the handler's return type, awaited.

One mypy run (--strict, a config file of its own, a cache in tmp_path) checks two snippets:
one whose every marked line must be an error of the marked code, and only those, and one
that must have none. The runtime's fixed sets of strings must equal their Literal types.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from pgqueue.models import LOST_POLICIES, JobStatus, Missed, OnLost, StatusName
from pgqueue.schedule import MISSED_POLICIES

mypy_api = pytest.importorskip("mypy.api")

WRONG = """
from datetime import timedelta

from pgqueue import AsyncQueue, JobContext, Queue

queue = Queue("postgresql://localhost/app")
aqueue = AsyncQueue("postgresql://localhost/app")


@queue.task
def add(a: int, b: int) -> int:
    return a + b


@queue.task(name="mul", queue="math")
def mul(a: int, b: int) -> int:
    return a * b


@aqueue.task
async def fetch(url: str) -> bytes:
    return url.encode()


def run(ctx: JobContext) -> None: ...


@queue.task
def first(ctx: JobContext, n: int) -> str:
    return str(n)


add(1, "x")  # E: arg-type
add.job("x")  # E: call-arg arg-type
add.enqueue(1)  # E: call-arg
add.job(1, 2, c=3)  # E: call-arg
add.with_options(priority=1).job("x", 2)  # E: arg-type
add.with_options(priority="high")  # E: arg-type
add.with_options(prio=1)  # E: call-arg
mul.enqueue(1, "2")  # E: arg-type
fetch.job(1)  # E: call-overload
first.enqueue("3")  # E: arg-type
first.job(n=1, m=2)  # E: call-arg
first.job(JobContext(1, "t", "q", 1, 1), 1)  # E: call-arg arg-type
text: str = queue.wait(add.enqueue(1, 2))  # E: assignment
more: str = queue.wait(queue.enqueue(add.job(1, 2)))  # E: assignment
count: int = queue.wait(first.enqueue(3))  # E: assignment
queue.enqueue(add.job(1, 2), delay="soon")  # E: arg-type
queue.enqueue("add", {"a": 1}, dedupe_key=5)  # E: arg-type
queue.declare("elsewhere", queue=7)  # E: arg-type
x: str = add(1, 2)  # E: assignment
queue.periodic(add, every=timedelta(minutes=5), missed="never")  # E: call-overload
queue.task(on_lost="sometimes")(run)  # E: call-overload
queue.list_jobs(status="done")  # E: arg-type
queue.list_jobs(limit="10")  # E: arg-type


async def later() -> None:
    await aqueue.enqueue(fetch, run_at="tomorrow")  # E: arg-type
    await fetch.with_options(delay=60).enqueue(b"bytes")  # E: arg-type
    # Read into a name first: given `x: str = await aqueue.wait(...)`, mypy tries the
    # overload for a bare id (an Enqueued is an int too) once the first one fails.
    body = await aqueue.wait(await fetch.enqueue("u"))
    text: str = body  # E: assignment
    sized = await aqueue.wait(await aqueue.enqueue(fetch.job("u")))
    same: str = sized  # E: assignment
"""

RIGHT = """
from collections.abc import Coroutine
from datetime import datetime, timedelta, timezone
from typing import Any

from typing_extensions import assert_type

import pgqueue
from pgqueue import AsyncQueue, Enqueued, JobContext, NewJob, Queue

queue = Queue("postgresql://localhost/app")
aqueue = AsyncQueue("postgresql://localhost/app")


@queue.task
def add(a: int, b: int = 0, *, label: str = "") -> int:
    return a + b


@queue.task(name="mul", queue="math", on_lost="fail", atomic=True)
def mul(a: int, b: int) -> int:
    return a * b


@queue.task
def tick(n: int, ctx: JobContext) -> None: ...


@queue.task(name="first")
def first(ctx: JobContext, n: int) -> str:
    return str(n)


@aqueue.task
async def fetch(url: str) -> bytes:
    return url.encode()


@queue.periodic(cron="*/5 * * * *", missed="run_once", args={"a": 1})
@queue.task(name="report")
def report(a: int) -> None: ...


assert_type(add(1, 2), int)
# An async handler's call is its coroutine, as at run time.
assert_type(fetch("u"), Coroutine[Any, Any, bytes]).close()
assert_type(add.job(1, label="x"), NewJob[int])
assert_type(fetch.job("u"), NewJob[bytes])  # an async handler's result is the awaited type
assert_type(add.enqueue(1), Enqueued[int])
assert_type(queue.wait(add.enqueue(1)), int)
assert_type(queue.wait(queue.enqueue(add.job(1), priority=2)), int)
assert_type(queue.wait(first.enqueue(3)), str)
assert_type(queue.wait(queue.enqueue(first.job(n=3))), str)
assert_type(queue.wait(7), Any)  # a bare id says nothing of its job
assert_type(queue.wait(queue.enqueue("add", {"a": 1})), Any)
assert_type(queue.enqueue_many([add.job(1), first.job(2)]), list[Enqueued])
add.enqueue(1, 2)
mul.enqueue(a=1, b=2)
add.with_options(delay=60, priority=5, tags=["a"]).enqueue(1)
add.with_options(run_at=datetime.now(timezone.utc)).job(a=2)
report.job(1)
tick.job(1)  # a handler taking JobContext: its jobs' arguments are not checked
first.enqueue(n=3)
first.enqueue(3)
elsewhere = queue.declare("elsewhere", queue="other")
elsewhere.enqueue(anything=1)
got: Enqueued = queue.enqueue(add.job(1), delay=timedelta(seconds=5), dedupe_key="k")
queue.enqueue("add", {"a": 1}, priority=3, queue="default", concurrency_key="tenant")
pgqueue.chain(add.job(1), add.s(2), mul.s(b=3))  # .s() takes what the step leaves out
queue.periodic(add, every=60, missed="skip")
queue.list_jobs(status="running", queue="math", limit=10)
queue.list_jobs(status=["queued", pgqueue.JobStatus.FAILED], tag="a", before_id=9)


@aqueue.periodic(every=60)
@aqueue.task
async def sweep(ctx: JobContext, older_than: int = 7) -> int:
    return older_than


async def later() -> None:
    await aqueue.enqueue(fetch.job("u"), run_at=datetime.now(timezone.utc))
    assert_type(await aqueue.wait(await fetch.enqueue("u")), bytes)
    assert_type(await aqueue.wait(await aqueue.enqueue(fetch.job("u"))), bytes)
    assert_type(await aqueue.wait(await sweep.enqueue(older_than=3)), int)
    periodic_kept_its_class: pgqueue.AsyncTask[..., Any] = sweep
    assert periodic_kept_its_class
    await fetch.with_options(dedupe_key="k", dedupe_window=30).enqueue("u")
    await fetch.enqueue(url="u")
"""


def expected_errors(snippet: str) -> set[tuple[int, str]]:
    marked: set[tuple[int, str]] = set()
    for number, line in enumerate(snippet.splitlines(), start=1):
        found = re.search(r"# E: ([\w -]+)$", line)
        if found:
            marked.update((number, code) for code in found.group(1).split())
    return marked


def test_mypy_refuses_wrong_task_arguments_and_options_and_accepts_right_ones(
    tmp_path: Path,
) -> None:
    (tmp_path / "wrong.py").write_text(textwrap.dedent(WRONG).lstrip("\n"))
    (tmp_path / "right.py").write_text(textwrap.dedent(RIGHT).lstrip("\n"))
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    out, err, _ = mypy_api.run(
        [
            "--strict",
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-error-summary",
            "--show-error-codes",
            str(tmp_path / "wrong.py"),
            str(tmp_path / "right.py"),
        ]
    )
    assert err == ""
    errors = re.findall(r"^(\S+\.py):(\d+): error: (.*)  \[([\w-]+)\]$", out, re.MULTILINE)
    assert [e for e in errors if e[0].endswith("right.py")] == [], out
    got = {(int(line), code) for path, line, _, code in errors if path.endswith("wrong.py")}
    assert got == expected_errors(textwrap.dedent(WRONG).lstrip("\n")), out
    messages = {message for _, _, message, _ in errors}
    assert 'Argument 2 to "__call__" of "Task" has incompatible type "str"; expected "int"' in (
        messages
    )
    assert 'Missing positional argument "b" in call to "enqueue" of "Task"' in messages
    assert (
        'Argument "delay" to "enqueue" of "Queue" has incompatible type "str"; '
        'expected "timedelta | float | None"' in messages
    )


def test_the_literal_types_name_the_values_the_validators_accept() -> None:
    assert get_args(OnLost) == LOST_POLICIES
    assert get_args(Missed) == MISSED_POLICIES
    assert get_args(StatusName) == tuple(status.value for status in JobStatus)
