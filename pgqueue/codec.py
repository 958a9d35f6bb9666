"""pgqueue's JSON: what a job's arguments, its result and its outcome rows become on the way
to PostgreSQL, and what JSON text from PostgreSQL becomes on the way back.

Owns: the compact encoder every job row and outcome goes through, the fast decoder the
worker's claim connection loads with, and the checks and limits on the way in (valid
Unicode, no NUL that jsonb refuses, no NaN, max_payload_bytes). Used by the registry (a
task's arguments), the store (rows and outcomes) and the worker (results). Fails with
InvalidArgumentsError naming the task or the job, or ValueError for a result.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable, Iterator
from typing import Any

from pydantic_core import to_jsonable_python

from pgqueue.errors import InvalidArgumentsError
from pgqueue.models import NewJob


def checked_json(task: str, value: dict[str, Any]) -> dict[str, Any]:
    """`value`, a task's arguments, if PostgreSQL can store it as jsonb; else an
    InvalidArgumentsError naming the task and the offending text."""
    for text in _strings(value):
        if not is_utf8(text):
            raise InvalidArgumentsError(
                f"task {task!r}: arguments contain a lone surrogate, which is not valid "
                f"Unicode and cannot be stored: {text[:40]!r}"
            )
        if "\x00" in text:
            raise InvalidArgumentsError(
                f"task {task!r}: arguments contain a NUL character (\\x00), which PostgreSQL "
                f"cannot store in jsonb: {text[:40]!r}"
            )
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentsError(f"task {task!r}: arguments are not JSON: {exc}") from None
    return value


def _compact_encoder() -> Callable[[Any], str]:
    """The stdlib's C JSON encoder, made once. json.dumps and JSONEncoder.encode make a new
    one per call, which was half the cost of encoding a job's arguments.
    It skips the circular-reference check: what reaches it was built as JSON data (validated
    arguments, pydantic's dump, a worker's outcome rows), and a cycle in a NewJob built by
    hand is still refused, by encode_args, as deeper than the recursion limit."""
    stdlib = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the C accelerator
        return stdlib.encode
    chunks = make(None, stdlib.default, json.encoder.encode_basestring_ascii, None,
                  ":", ",", False, False, False)  # fmt: skip
    return lambda value: "".join(chunks(value, 0))


# Compact JSON text, NaN and infinities refused (ValueError); for acyclic JSON-ready data.
encode_json = _compact_encoder()


def encode_rows(rows: list[dict[str, Any]]) -> str:
    """Job rows as one JSON parameter; a NewJob built by hand with arguments that are not
    JSON (a set, NaN, a cycle) is an InvalidArgumentsError and nothing is stored."""
    try:
        return encode_json(rows)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentsError(f"job arguments are not JSON: {exc}") from None


# The C scanner under json.loads; decode_json uses it.
_scan: Callable[[str, int], tuple[Any, int]]
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: a class


def decode_json(data: str | bytes) -> Any:
    """json.loads for JSON text from PostgreSQL, the claim connection's loader
    (worker/sessions.py, Sessions.claim), several times faster on a job's arguments. json.loads
    of bytes first guesses their encoding in Python, then strips whitespace around the value
    with regular expressions; this runs the C scanner on the UTF-8 text, and anything it does
    not consume whole (surrounding whitespace, bad JSON, other encodings) goes to json.loads
    as it came, so the result, or the error, is always json.loads'. A module function, not a
    closure: psycopg makes and keeps a loader class per function."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        value, end = _scan(text, 0)
    except (UnicodeDecodeError, StopIteration, json.JSONDecodeError):
        return json.loads(data)
    return value if end == len(text) else json.loads(data)


def encode_args(job: NewJob) -> str:
    """A job's arguments as the JSON text stored; InvalidArgumentsError if they are not JSON
    (a NewJob built by hand: task.job() has checked them)."""
    try:
        return encode_json(job.args)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentsError(f"task {job.task!r}: arguments are not JSON: {exc}") from None


def too_large(index: int, job: NewJob, size: int, limit: int) -> InvalidArgumentsError:
    """The error for job `index` of a batch whose arguments are `size` bytes, over
    max_payload_bytes `limit`."""
    return InvalidArgumentsError(
        f"job {index} ({job.task}) has {size:,} bytes of arguments, over "
        f"max_payload_bytes={limit:,}: store large data elsewhere and pass a reference"
    )


def is_utf8(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogate), as PostgreSQL needs."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


_INT64 = 2**63  # to_json_result returns ints in [-2**63, 2**63) as they are


def to_json_result(value: Any, max_bytes: int | None = None) -> Any:
    """A handler's return value as JSON-ready data; raises ValueError if it cannot be stored.

    None, a bool or a 64-bit int is returned as it is: its JSON is far below any
    max_payload_bytes (at least 1,024), and measuring it was a visible share of a short job's
    time in the worker."""
    if value is None or type(value) is bool or (type(value) is int and -_INT64 <= value < _INT64):
        return value
    if isinstance(value, (bool, int, float)):
        data = value
    else:
        data = to_jsonable_python(value)
        if any("\x00" in text for text in _strings(data)):
            raise ValueError("the result contains a NUL character (\\x00), which jsonb rejects")
    size = len(encode_json(data))
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"the result is {size:,} bytes, over max_payload_bytes={max_bytes:,}")
    return data


def step_json(value: Any, max_bytes: int | None = None) -> str:
    """A durable step's result (pgqueue/worker/durable.py) as the JSON text recorded; ValueError if
    it is not JSON as it is (only dicts with string keys, lists, strings, numbers, booleans
    and None: a replay must give back what the first run gave), or is over `max_bytes`."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"it is not JSON: {exc}") from None
    if _non_string_keys(value):
        raise ValueError(
            "a dict in it has keys that are not strings, which JSON turns into strings"
        )
    for text_value in _strings(value):
        if "\x00" in text_value or not is_utf8(text_value):
            raise ValueError(
                f"it contains a NUL character or a lone surrogate, which jsonb rejects: "
                f"{text_value[:40]!r}"
            )
    size = len(text.encode("utf-8", "surrogatepass"))
    if max_bytes is not None and size > max_bytes:
        raise ValueError(f"it is {size:,} bytes of JSON, over max_payload_bytes={max_bytes:,}")
    return text


def _non_string_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _non_string_keys(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_non_string_keys(item) for item in value)
    return False
