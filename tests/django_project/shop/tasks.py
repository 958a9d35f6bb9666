"""django.tasks tasks on pgqueue's backend (Django 6), the cases Django's own backend tests
exercise, for tests/integration/test_django_tasks.py."""

import os
import time

from django.tasks import TaskContext, task

from shop.models import Order


@task()
def noop_task(*args, **kwargs):
    return None


@task()
async def noop_task_async(*args, **kwargs):
    return None


@task(priority=10, queue_name="mail")
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error():
    raise ValueError("This task failed due to ValueError")


@task()
def failing_task_system_exit():
    raise SystemExit("This task failed due to SystemExit")


@task()
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value():
    return object()  # not JSON: the job fails, as Django's backends have it


@task(takes_context=True)
def get_task_id(context):
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt):
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    return context.attempt


@task(backend="retrying", takes_context=True)
def fails_once(context):
    if context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return context.attempt


@task()
def wait_for(path: str) -> str:
    """Runs until `path` exists: the test sees it RUNNING, then lets it finish."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return path


@task()
def mark_sent(order_id: int) -> int:
    return Order.objects.filter(id=order_id).update(receipt_sent=True)
