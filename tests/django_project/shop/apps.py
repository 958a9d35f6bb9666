"""Records django.tasks signals, in each process, as JSON lines in $SIGNAL_LOG."""

import json
import os

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"

    def ready(self) -> None:
        try:
            from django.tasks import signals
        except ImportError:  # Django before 6
            return

        def record(name):
            def receiver(sender, task_result, **kwargs):
                path = os.environ.get("SIGNAL_LOG")
                if not path:
                    return
                line = {
                    "signal": name,
                    "sender": sender.__name__,
                    "id": task_result.id,
                    "task": task_result.task.module_path,
                    "status": str(task_result.status),
                    "attempts": task_result.attempts,
                    "errors": [e.exception_class_path for e in task_result.errors],
                    "started_at": _iso(task_result.started_at),
                    "last_attempted_at": _iso(task_result.last_attempted_at),
                }
                with open(path, "a") as log:
                    log.write(json.dumps(line) + "\n")

            return receiver

        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(signals, name).connect(record(name), weak=False)


def _iso(at):
    return None if at is None else at.isoformat()
