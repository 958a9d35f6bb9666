"""RabbitMQ: each message published to an exchange with a routing key, destination
"rabbitmq:EXCHANGE/ROUTING_KEY" ("rabbitmq:/orders" is the default exchange, to the queue
`orders`). Uses aio-pika (`pip install 'pgqueue-py[rabbitmq]'`).

Publisher confirms: the channel confirms each message once the broker has it (persistent
messages, so on disk for a durable queue); the relay deletes nothing before that. Mandatory
routing: a message no queue is bound to receive comes back as unroutable and is refused for
good (a dead letter), never dropped in silence. The message id is the AMQP message_id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.exceptions import DeliveryError, PublishError

from pgqueue.relay.sinks import Outgoing


class RabbitMQ:
    def __init__(self, url: str = "amqp://guest:guest@127.0.0.1:5672/") -> None:
        self.url = url
        self._connection: Any = None
        self._channel: Any = None
        self._exchanges: dict[str, Any] = {}

    async def open(self) -> None:
        self._connection = await aio_pika.connect_robust(self.url)
        self._channel = await self._connection.channel(
            publisher_confirms=True, on_return_raises=True
        )
        self._exchanges = {}

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        outcomes: list[str | None] = []
        for m in messages:
            exchange_name, _, routing_key = m.target.partition("/")
            exchange = await self._exchange(exchange_name)
            headers: dict[str, Any] = dict(m.headers or {})
            if m.key:
                headers["key"] = m.key
            body = aio_pika.Message(
                json.dumps(m.message).encode(),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=m.message_id,
                headers=headers,
            )
            try:
                await exchange.publish(body, routing_key=routing_key, mandatory=True)
            except DeliveryError as exc:  # returned unroutable, or nacked
                outcomes.append(f"rabbitmq refused it: {_reason(exc)}")
                continue
            except PublishError as exc:
                outcomes.append(f"rabbitmq refused it: {exc}")
                continue
            outcomes.append(None)
        return outcomes

    async def _exchange(self, name: str) -> Any:
        """The exchange by name, without declaring it: a missing one is the operator's to
        make, and publishing to it closes the channel (retried, then it stays staged)."""
        if name not in self._exchanges:
            if name:
                self._exchanges[name] = await self._channel.get_exchange(name, ensure=False)
            else:
                self._exchanges[name] = self._channel.default_exchange
        return self._exchanges[name]


def _reason(exc: DeliveryError) -> str:
    frame = getattr(exc, "frame", None)
    text = getattr(frame, "reply_text", None) if frame is not None else None
    return str(text or exc)
