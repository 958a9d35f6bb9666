"""Task registration and argument validation, without a database."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgqueue import (
    ConfigurationError,
    InvalidArgumentsError,
    JobContext,
    Queue,
    UnknownTaskError,
)
from pgqueue.codec import decode_json, to_json_result


def test_task_with_star_args_is_refused_at_registration() -> None:
    queue = Queue()
    with pytest.raises(ConfigurationError, match=r"\*args and \*\*kwargs"):
        queue.task(name="t")(lambda *xs: None)


def test_two_tasks_under_one_name_are_refused() -> None:
    queue = Queue()
    queue.task(name="same")(lambda: None)
    with pytest.raises(ConfigurationError, match="registered twice"):
        queue.task(name="same")(lambda: None)


def test_unknown_task_name_lists_the_registered_ones() -> None:
    queue = Queue()
    queue.task(name="known")(lambda: None)
    with pytest.raises(UnknownTaskError, match=r"'missing'.*known"):
        queue.enqueue("missing", {})


def test_job_context_is_injected_not_stored() -> None:
    queue = Queue()

    @queue.task(name="t")
    def t(x: int, ctx: JobContext) -> None: ...

    assert t.job(3).args == {"x": 3}


def test_arguments_by_position_skip_the_job_context_wherever_it_sits() -> None:
    """As the task's type says: its parameters are the handler's less the context."""
    queue = Queue()

    @queue.task(name="first")
    def first(ctx: JobContext, sku: str, count: int = 1) -> None: ...

    @queue.task(name="middle")
    def middle(a: int, ctx: JobContext, b: int) -> None: ...

    assert first.job("abc", 2).args == {"sku": "abc", "count": 2}
    assert middle.job(1, 2).args == {"a": 1, "b": 2}
    with pytest.raises(InvalidArgumentsError, match="ctx"):
        first.job(ctx=None, sku="abc")  # type: ignore[call-arg]
    ctx = JobContext(1, "first", "default", 1, 25)
    assert first.load_args(first.job("abc").args, ctx) == ([], {"ctx": ctx, "sku": "abc"})


def test_defaults_are_not_stored_so_code_can_change_them() -> None:
    queue = Queue()

    @queue.task(name="t")
    def t(x: int, limit: int = 10) -> None: ...

    assert t.job(1).args == {"x": 1}
    assert t.job(1, limit=2).args == {"x": 1, "limit": 2}


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "missing a required argument"),
        ((1, 2), {}, "too many positional"),
        (("x",), {}, "invalid arguments"),
        ((1,), {"nope": 1}, "unexpected keyword"),
        ((float("nan"),), {}, "invalid arguments|not JSON"),
    ],
)
def test_bad_call_arguments_raise_invalid_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], message: str
) -> None:
    queue = Queue()

    @queue.task(name="t")
    def t(x: int) -> None: ...

    with pytest.raises(InvalidArgumentsError, match=message):
        t.job(*args, **kwargs)


def test_declared_remote_task_takes_json_keywords_only() -> None:
    queue = Queue()
    remote = queue.declare("billing.charge", queue="billing")
    job = remote.job(customer=7, amount="12.50")
    assert job.args == {"customer": 7, "amount": "12.50"} and job.options.queue == "billing"
    with pytest.raises(InvalidArgumentsError):
        remote.job(1)
    with pytest.raises(InvalidArgumentsError, match="NUL"):
        remote.job(note="a\x00b")
    with pytest.raises(UnknownTaskError):
        remote()


def test_pooled_enqueue_without_dsn_says_what_to_do() -> None:
    queue = Queue()
    t = queue.task(name="t")(lambda: None)
    with pytest.raises(ConfigurationError, match="no dsn"):
        t.enqueue()


def test_a_task_in_a_script_run_as_main_needs_an_explicit_name() -> None:
    queue = Queue()

    def handler() -> None: ...

    handler.__module__ = "__main__"
    with pytest.raises(ConfigurationError, match="explicit name="):
        queue.task(handler)
    assert queue.task(name="named")(handler).name == "named"


@pytest.mark.parametrize("value", [None, True, False, 0, -(2**63), 2**63 - 1])
def test_small_scalar_results_are_stored_as_returned(value: Any) -> None:
    assert to_json_result(value, 1024) is value


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (10**2000, "2,001 bytes, over max_payload_bytes=1,024"),  # past the scalar shortcut
        (float("nan"), "Out of range float values"),
        ("x" * 2000, "2,002 bytes, over max_payload_bytes=1,024"),
        ({"text": "a\x00b"}, "NUL character"),
    ],
)
def test_results_that_cannot_be_stored_are_refused(value: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        to_json_result(value, 1024)


@pytest.mark.parametrize(
    "text",
    [
        '{"seq": 1}',
        '{"a": [1, 2.5, -3e7, true, false, null], "b": {"c": "\\u00e9\\ud83d\\ude00 \\"q\\""}}',
        "{}",
        '"plain"',
        "12",
        ' {"spaced": 1} ',
        '{"seq": 1} trailing',
        '{"unclosed": ',
        "",
        "NaN",
    ],
)
def test_the_claim_decoder_answers_as_json_loads(text: str) -> None:
    try:
        expected: Any = ("value", json.loads(text))
    except json.JSONDecodeError as exc:
        expected = ("error", exc.msg)
    try:
        got: Any = ("value", decode_json(text.encode()))
    except json.JSONDecodeError as exc:
        got = ("error", exc.msg)
    assert got == expected


@pytest.mark.parametrize(
    "data",
    [
        '{"a": [1, "é"]}'.encode(),
        '{"a": 1}'.encode("utf-16-le"),  # json.loads guesses this encoding from the NULs
        '{"a": 1}'.encode("utf-8-sig"),
        b'"\xed\xa0\x80"',  # a lone surrogate, which json.loads decodes with surrogatepass
        b"1\x00\x00\x00",  # UTF-32 to json.loads, "1" and garbage to a UTF-8 reading
        b"\xff",
    ],
)
def test_the_claim_decoder_answers_as_json_loads_on_any_bytes(data: bytes) -> None:
    try:
        expected: Any = ("value", json.loads(data))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        expected = ("error", type(exc), str(exc))
    try:
        got: Any = ("value", decode_json(data))
    except ValueError as exc:
        got = ("error", type(exc), str(exc))
    assert got == expected


def test_queues_of_all_include_what_the_fallbacks_integration_discovers() -> None:
    from pgqueue.registry import Discovered
    from pgqueue.worker.worker import Worker

    queue = Queue()
    queue.task(name="shop.add", queue="math")(lambda: None)
    queue.registry.discover = lambda: Discovered(
        tasks={"shop.tasks.send": "mail"}, queues=frozenset({"reports"})
    )
    assert queue.registry.queues() == ["default", "mail", "math", "reports"]
    assert queue.registry.queue_of_each_task() == {"shop.add": "math", "shop.tasks.send": "mail"}
    worker = Worker(queue, dsn="postgresql://", queues=("*",))
    assert worker.settings.queues == ("default", "mail", "math", "reports")


def test_a_handler_the_fallback_gave_leaves_its_queue_to_discover() -> None:
    from pgqueue.models import JobOptions, TaskPolicy
    from pgqueue.registry import Discovered, Task

    queue = Queue()
    found = Task(lambda: None, name="shop.tasks.send", options=JobOptions(), policy=TaskPolicy())
    queue.registry.fallback = lambda name: found if name == "shop.tasks.send" else None
    queue.registry.get("shop.tasks.send")  # a job named it: now kept, with no queue of its own
    assert queue.registry.queue_of_each_task() == {}
    queue.registry.discover = lambda: Discovered(tasks={"shop.tasks.send": "mail"})
    assert queue.registry.queue_of_each_task() == {"shop.tasks.send": "mail"}
