"""Redis Streams: each message an entry XADDed to the stream its destination names
("redis:orders" adds to the stream `orders`), with fields `id` (the stable message id),
`key`, `message` (JSON) and `headers` (JSON). Uses redis-py (`pip install 'pgqueue-py[redis]'`).

Redis confirms an XADD by answering it; the relay pipelines a batch and reads every answer
before deleting anything. An answer that is an error (the key holds another type) refuses
that message for good; a lost connection retries the whole batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis.asyncio
from redis.exceptions import ResponseError

from pgqueue.relay.sinks import Outgoing


class RedisStreams:
    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, maxlen: int | None = None) -> None:
        """`maxlen` caps each stream, approximately (XADD MAXLEN ~)."""
        self.url = url
        self.maxlen = maxlen
        self._client: Any = None

    async def open(self) -> None:
        self._client = redis.asyncio.from_url(self.url)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def publish(self, messages: Sequence[Outgoing]) -> Sequence[str | None]:
        async with self._client.pipeline(transaction=False) as pipe:
            for m in messages:
                fields = {
                    "id": m.message_id,
                    "key": m.key or "",
                    "message": json.dumps(m.message),
                    "headers": json.dumps(m.headers or {}),
                }
                pipe.xadd(m.target, fields, maxlen=self.maxlen, approximate=True)
            answers = await pipe.execute(raise_on_error=False)
        for answer in answers:
            if isinstance(answer, Exception) and not isinstance(answer, ResponseError):
                raise answer  # not an answer about the message: try the batch again
        return [f"redis refused it: {a}" if isinstance(a, ResponseError) else None for a in answers]
