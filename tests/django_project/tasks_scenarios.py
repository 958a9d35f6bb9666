"""django.tasks on pgqueue's backend, driven from one process with real workers
(`manage.py pgqueue_worker` processes): prints what it saw as JSON, for
tests/integration/test_django_tasks.py to judge. Needs Django 6."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.db import transaction  # noqa: E402
from django.tasks import task_backends  # noqa: E402
from django.tasks.exceptions import InvalidTaskBackend, TaskResultDoesNotExist  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop import tasks  # noqa: E402
from shop.jobs import send_receipt  # noqa: E402
from shop.models import Order  # noqa: E402

from pgqueue import WaitTimeoutError  # noqa: E402
from pgqueue.contrib.django import queue  # noqa: E402
from pgqueue.contrib.django.tasks import await_result, wait_result  # noqa: E402

backend = task_backends["default"]
seen: dict = {}


def jobs() -> int:
    return len(queue().list_jobs(limit=1000).jobs)


def refused(call) -> str:
    """The exception class a bad enqueue raised; the job count says nothing was stored."""
    before = jobs()
    try:
        call()
    except Exception as exc:  # what the caller would see
        assert jobs() == before, "a refused enqueue stored a job"
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


def missing(result_id) -> bool:
    try:
        backend.get_result(result_id)
    except TaskResultDoesNotExist:
        return True
    return False


def signals_sent(name: str, result_id: str) -> int:
    """How many `name` signals this process has sent so far for the result."""
    if not os.path.exists(os.environ["SIGNAL_LOG"]):
        return 0
    with open(os.environ["SIGNAL_LOG"]) as log:
        events = [json.loads(line) for line in log]
    return sum(1 for e in events if e["signal"] == name and e["id"] == result_id)


def worker(*extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "pgqueue_worker", "--queues", "default,mail", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(result, *statuses: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result.refresh()
        if str(result.status) in statuses:
            return result
        time.sleep(0.05)
    raise AssertionError(f"{result.task.module_path} stayed {result.status}")


def described(result) -> dict:
    out = {
        "status": str(result.status),
        "attempts": result.attempts,
        "args": result.args,
        "kwargs": result.kwargs,
        "errors": [e.exception_class_path for e in result.errors],
        "tracebacks": [e.traceback for e in result.errors],
        "times_in_order": bool(
            result.enqueued_at
            and result.started_at
            and result.finished_at
            and result.enqueued_at <= result.started_at <= result.finished_at
        ),
        "queue_name": result.task.queue_name,
        "priority": result.task.priority,
    }
    if str(result.status) == "SUCCESSFUL":
        out["return_value"] = result.return_value
    else:
        try:
            result.return_value  # noqa: B018
        except ValueError as exc:
            out["return_value_error"] = str(exc)
    return out


# An alias whose backend does not exist stops nothing until it is used.
try:
    task_backends["missing"]
except InvalidTaskBackend as exc:
    seen["missing_alias"] = str(exc)

# Transactions: the job is the block's.
with transaction.atomic():
    order = Order.objects.create(item="tea")
    committed = tasks.mark_sent.enqueue(order.id)
    seen["inside_block"] = str(backend.get_result(committed.id).status)
    enqueued_inside = signals_sent("task_enqueued", committed.id)
try:
    with transaction.atomic():
        order = Order.objects.create(item="cake")
        rolled_back = tasks.mark_sent.enqueue(order.id)
        raise RuntimeError("the view failed")
except RuntimeError:
    pass
with transaction.atomic():
    outer_order = Order.objects.create(item="jam")
    outer = tasks.mark_sent.enqueue(outer_order.id)
    try:
        with transaction.atomic():  # a savepoint
            inner_order = Order.objects.create(item="bun")
            inner = tasks.mark_sent.enqueue(inner_order.id)
            raise RuntimeError("the inner step failed")
    except RuntimeError:
        pass
seen["rolled_back_missing"] = missing(rolled_back.id)
seen["savepoint_missing"] = missing(inner.id)
seen["outer_status"] = str(backend.get_result(outer.id).status)
autocommitted = tasks.noop_task.enqueue()
seen["task_enqueued_sent"] = {
    "inside_the_block": enqueued_inside,
    "after_its_commit": signals_sent("task_enqueued", committed.id),
    "rolled_back": signals_sent("task_enqueued", rolled_back.id),
    "savepoint_rolled_back": signals_sent("task_enqueued", inner.id),
    "outer_committed": signals_sent("task_enqueued", outer.id),
    "autocommit": signals_sent("task_enqueued", autocommitted.id),
}

# Bad input: Django's own checks and pgqueue's, and nothing stored.
seen["refused"] = {
    "non_json": refused(lambda: tasks.noop_task.enqueue(datetime.now())),
    "wrong_type": refused(lambda: tasks.mark_sent.enqueue("five")),
    "too_many": refused(lambda: tasks.mark_sent.enqueue(1, 2)),
    "nul": refused(lambda: tasks.noop_task.enqueue("a\x00b")),  # JSON, but not for jsonb
    "nan": refused(lambda: tasks.noop_task.enqueue(float("nan"))),
    "unknown_queue": refused(lambda: tasks.noop_task.using(queue_name="nowhere").enqueue()),
    "priority": refused(lambda: tasks.noop_task.using(priority=101)),
    "naive_run_after": refused(lambda: tasks.noop_task.using(run_after=datetime.now()).enqueue()),
}
plain_job = int(send_receipt.enqueue(outer_order.id))
seen["missing"] = {
    "not_a_number": missing("nonsense"),
    "no_such_job": missing("987654321"),
    "a_plain_pgqueue_job": missing(str(plain_job)),
}

# Jobs naming what is not a django.tasks task of this backend: never run.
strangers = {
    name: int(queue().enqueue(queue().declare(name, max_attempts=1), {"command": "true"}))
    for name in ("os.system", "shop.models.Order", "shop.tasks.no_such_task")
}

# Priority: higher first, one slot, enqueued low first.
low = tasks.noop_task.using(priority=-50).enqueue()
high = tasks.noop_task.using(priority=50).enqueue()
burst = worker("--burst", "--concurrency", "1")
assert burst.wait(120) == 0, burst.stderr.read()
low, high = backend.get_result(low.id), backend.get_result(high.id)
seen["higher_priority_started_first"] = high.started_at < low.started_at
seen["after_burst"] = {
    "committed": str(backend.get_result(committed.id).status),
    "outer": str(backend.get_result(outer.id).status),
    "orders_sent": sorted(Order.objects.filter(receipt_sent=True).values_list("item", flat=True)),
}
seen["strangers"] = {}
for name, job_id in strangers.items():
    job = queue().get_job(job_id)
    seen["strangers"][name] = [job.status.value, job.errors[-1]["error"] if job.errors else None]

# The contract, with a worker running.
gate = os.path.join(tempfile.mkdtemp(), "open")
cases = {
    "noop": tasks.noop_task.enqueue(1, two=3),
    "noop_async": asyncio.run(tasks.noop_task_async.aenqueue()),
    "meaning": tasks.calculate_meaning_of_life.enqueue(),
    "value_error": tasks.failing_task_value_error.enqueue(),
    "system_exit": tasks.failing_task_system_exit.enqueue(),
    "complex_exception": tasks.complex_exception.enqueue(),
    "complex_return_value": tasks.complex_return_value.enqueue(),
    "task_id": tasks.get_task_id.enqueue(),
    "context": tasks.check_context.enqueue(1),
    "fails_once": tasks.fails_once.enqueue(),
}
later = tasks.calculate_meaning_of_life.using(run_after=timezone.now() + timedelta(hours=1))
deferred = later.enqueue()
seen["deferred_id"] = deferred.id
gated = tasks.wait_for.enqueue(gate)
seen["ready_before_worker"] = str(gated.status)
seen["result_api_mismatch"] = refused(lambda: tasks.noop_task.get_result(cases["meaning"].id))
seen["aget_result"] = str(asyncio.run(tasks.wait_for.aget_result(gated.id)).status)

running = worker("--concurrency", "20")
try:
    gated = wait_for(gated, "RUNNING")
    seen["running"] = {
        "status": str(gated.status),
        "started": gated.started_at is not None,
        "attempts": gated.attempts,
        "return_value_error": described(gated).get("return_value_error"),
    }
    open(gate, "w").close()
    seen["gated"] = described(wait_for(gated, "SUCCESSFUL", "FAILED"))
    # pgqueue's wait_result hears each finish; the async one waits beside the loop.
    seen["cases"] = {
        name: described(
            asyncio.run(await_result(result, timeout=60))
            if name == "noop_async"
            else wait_result(result, timeout=60)
        )
        for name, result in cases.items()
    }
    try:
        wait_result(deferred, timeout=0.3)
    except WaitTimeoutError as exc:
        seen["deferred_wait"] = {"timed_out": True, "job_ids": exc.job_ids}
    seen["task_id_matches"] = cases["task_id"].return_value == cases["task_id"].id
    deferred.refresh()
    seen["deferred"] = {"status": str(deferred.status), "run_after_kept": deferred.task.run_after}
finally:
    running.send_signal(signal.SIGTERM)
    seen["worker_exit"] = running.wait(60)
seen["deferred"]["run_after_kept"] = seen["deferred"]["run_after_kept"] == later.run_after

ids = {result.id: name for name, result in cases.items()}
ids[gated.id] = "gated"
trail: dict[str, list] = {}
with open(os.environ["SIGNAL_LOG"]) as log:
    events = [json.loads(line) for line in log]
for event in events:
    if event["id"] in ids:
        trail.setdefault(ids[event["id"]], []).append(
            [event["signal"], event["status"], event["attempts"], event["errors"]]
        )
seen["signals"] = trail
seen["fails_once_times"] = {
    "signals": [
        [e["signal"], e["started_at"], e["last_attempted_at"]]
        for e in events
        if e["id"] == cases["fails_once"].id
    ],
    "result": [
        cases["fails_once"].started_at.isoformat(),
        cases["fails_once"].last_attempted_at.isoformat(),
    ],
}
seen["signal_sender"] = sorted({event["sender"] for event in events})
print(json.dumps(seen))
