"""NATS JetStream: each message published to a subject, destination "nats:SUBJECT", with
its message id in the `Nats-Msg-Id` header, so that JetStream's own dedupe window drops a
re-published duplicate. Uses nats-py (`pip install 'pgqueue-py[nats]'`).

JetStream confirms a publish with an acknowledgement once the stream has stored it; the
relay deletes nothing before that. A subject no stream captures is refused for good (a dead
letter); a timeout or a lost connection retries the batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import nats
from nats.js.errors import NoStreamResponseError

from pgqueue.relay.sinks import Outgoing


class NatsJetStream:
    def __init__(self, servers: str = "nats://127.0.0.1:4222", *, timeout: float = 5.0) -> None:
        self.servers = servers
        self.timeout = timeout
        self._client: Any = None
        self._js: Any = None

    async def open(self) -> None:
        self._client = await nats.connect(self.servers)
        self._js = self._client.jetstream(timeout=self.timeout)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.drain()
            self._client = None

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        outcomes: list[str | None] = []
        for m in messages:
            headers = dict(m.headers or {}) | {"Nats-Msg-Id": m.message_id}
            if m.key:
                headers["Pgqueue-Key"] = m.key
            try:
                await self._js.publish(m.target, json.dumps(m.message).encode(), headers=headers)
            except NoStreamResponseError:
                outcomes.append(f"nats refused it: no stream captures subject {m.target!r}")
                continue
            outcomes.append(None)
        return outcomes
