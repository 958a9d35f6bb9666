"""The Celery application of tests/integration/test_relay_brokers.py: an unchanged Celery
worker, started by the test, runs the task calls the relay sends. Each call appends its
arguments and task id to a Redis list, so the test sees what ran, and how often."""

from __future__ import annotations

import json
import os

import redis
from celery import Celery, current_task

BROKER = os.environ.get("CELERY_TEST_BROKER", "redis://127.0.0.1:6379/15")
RESULTS = os.environ.get("CELERY_TEST_LIST", "pgqueue-celery-ran")

app = Celery("pgqueue_test", broker=BROKER)
app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(name="shop.record_order")
def record_order(order: int, note: str = "") -> None:
    line = {"order": order, "note": note, "task_id": current_task.request.id}
    redis.Redis.from_url(BROKER).rpush(RESULTS, json.dumps(line))
