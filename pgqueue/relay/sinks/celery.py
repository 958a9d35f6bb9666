"""Celery: each message a task call sent through Celery's own API to its broker, so an
unchanged Celery worker runs it. Destination "celery:TASK_NAME"; the message is
{"args": [...], "kwargs": {...}} (either may be left out). The task id is the message id,
so a re-published call has the id of the first. Uses your Celery app
(`pip install 'pgqueue-py[celery]'`); set `broker_transport_options={"confirm_publish": True}`
on an AMQP broker so that sending waits for the broker's confirmation. On a Redis broker
Celery needs its Redis transport too: `pip install 'celery[redis]'`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pgqueue.relay.sinks import Outgoing


class CelerySink:
    def __init__(self, app: Any) -> None:
        """`app` is your celery.Celery application (its broker URL and settings)."""
        self.app = app

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        return await asyncio.to_thread(self._send, messages)

    def _send(self, messages: Sequence[Outgoing]) -> list[str | None]:
        outcomes: list[str | None] = []
        for m in messages:
            call = m.message if isinstance(m.message, dict) else None
            args, kwargs = (call or {}).get("args", []), (call or {}).get("kwargs", {})
            if call is None or not isinstance(args, list) or not isinstance(kwargs, dict):
                outcomes.append('a Celery message is {"args": [...], "kwargs": {...}}')
                continue
            self.app.send_task(
                m.target, args=args, kwargs=kwargs, task_id=m.message_id, headers=m.headers
            )
            outcomes.append(None)
        return outcomes
