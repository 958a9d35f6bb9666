"""One key's messages keep their order through a real `pgqueue relay` process to every real
broker, while 8 connections stage at once, and when the relay is killed with SIGKILL
mid-stream and started again.

Each transaction locks its key (as an application locks the row its messages are about), so
transactions of one key commit one after another, then stages the key's next messages in
several statements. Half the connections wait, after a transaction's first statement, until
the relay has published a message that another transaction staged and committed meanwhile:
their transactions' ids straddle where the relay has read. A sequence number per key, taken
under that lock, is the order the broker must show: commit order across transactions,
staging order within one. A kill re-publishes what was in flight, so the check is on each
message's first publication; nothing may be missing."""

from __future__ import annotations

import abc
import asyncio
import base64
import bisect
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Message, Queue
from tests.conftest import ROOT, count, env_without_dsn, wait_until

# Run on each server CI tests against: per-key order under the server's locks.
pytestmark = pytest.mark.each_server

REDIS_URL = os.environ.get("PGQUEUE_TEST_REDIS", "redis://127.0.0.1:6379/0")
RABBIT_URL = os.environ.get("PGQUEUE_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("PGQUEUE_TEST_NATS", "nats://127.0.0.1:4222")
CELERY_BROKER = "redis://127.0.0.1:6379/15"

CONNECTIONS = 8  # half of them straddle: see stage()
KEYS = 6  # per half
TRANSACTIONS = 40  # per straddling connection; the others stage until those are done
STATEMENTS = 3  # per transaction, each staging MESSAGES of the transaction's key
MESSAGES = 2


class Broker(abc.ABC):
    """One sink's broker: where the relay publishes, and what it holds, in its order."""

    sink = ""

    @abc.abstractmethod
    def destination(self) -> str: ...

    def env(self) -> dict[str, str]:
        return {}

    def message(self, key: str, seq: int) -> Any:
        return {"key": key, "seq": seq}

    @abc.abstractmethod
    def published(self) -> list[tuple[str, int]]:
        """(key, seq) of every message the broker holds, in the order it was published."""

    def close(self) -> None:
        return None


class RedisStream(Broker):
    sink = "redis"

    def __init__(self) -> None:
        redis = pytest.importorskip("redis", reason="pip install 'pgqueue[redis]'")
        self.client = redis.Redis.from_url(REDIS_URL)
        try:
            self.client.ping()
        except redis.exceptions.ConnectionError as exc:
            pytest.skip(f"no Redis at {REDIS_URL} ({exc}): .ci/run starts one")
        self.stream = f"pgqueue-order-{uuid.uuid4().hex[:10]}"

    def destination(self) -> str:
        return f"redis:{self.stream}"

    def env(self) -> dict[str, str]:
        return {"REDIS_URL": REDIS_URL}

    def published(self) -> list[tuple[str, int]]:
        found = [json.loads(fields[b"message"]) for _, fields in self.client.xrange(self.stream)]
        return [(m["key"], m["seq"]) for m in found]

    def close(self) -> None:
        self.client.delete(self.stream)
        self.client.close()


class RabbitQueue(Broker):
    sink = "rabbitmq"

    def __init__(self) -> None:
        self.aio_pika = pytest.importorskip("aio_pika", reason="pip install 'pgqueue[rabbitmq]'")
        self.queue = f"pgqueue-order-{uuid.uuid4().hex[:8]}"
        try:
            asyncio.run(self._declare())
        except (OSError, self.aio_pika.exceptions.AMQPConnectionError) as exc:
            pytest.skip(f"no RabbitMQ at {RABBIT_URL} ({exc}): .ci/run needs one")

    async def _declare(self) -> None:
        async with await self.aio_pika.connect(RABBIT_URL) as connection:
            channel = await connection.channel()
            await channel.declare_queue(self.queue, durable=True, auto_delete=False)

    def destination(self) -> str:
        return f"rabbitmq:/{self.queue}"

    def env(self) -> dict[str, str]:
        return {"RABBIT_URL": RABBIT_URL}

    def published(self) -> list[tuple[str, int]]:
        async def drain() -> list[tuple[str, int]]:
            got = []
            async with await self.aio_pika.connect(RABBIT_URL) as connection:
                channel = await connection.channel()
                queue = await channel.get_queue(self.queue)
                while (message := await queue.get(no_ack=True, fail=False)) is not None:
                    body = json.loads(message.body)
                    got.append((body["key"], body["seq"]))
            return got

        return asyncio.run(drain())

    def close(self) -> None:
        async def delete() -> None:
            async with await self.aio_pika.connect(RABBIT_URL) as connection:
                channel = await connection.channel()
                await channel.queue_delete(self.queue)

        asyncio.run(delete())


class NatsStream(Broker):
    sink = "nats"

    def __init__(self) -> None:
        self.nats = pytest.importorskip("nats", reason="pip install 'pgqueue[nats]'")
        self.stream = f"PGQ_ORDER_{uuid.uuid4().hex[:8].upper()}"
        self.subject = f"pgqorder.{self.stream.lower()}"
        try:
            asyncio.run(self._call(lambda js: js.add_stream(name=self.stream,
                                                            subjects=[self.subject])))  # fmt: skip
        except Exception as exc:  # nats-py raises its own and OSError kinds
            pytest.skip(f"no NATS JetStream at {NATS_URL} ({exc}): .ci/run needs one")

    async def _call(self, fn: Any) -> Any:
        # One attempt: a NATS that is not there skips the test at once, quietly.
        client = await self.nats.connect(
            NATS_URL, connect_timeout=5, max_reconnect_attempts=1, error_cb=_quiet
        )
        try:
            return await fn(client.jetstream())
        finally:
            await client.close()

    def destination(self) -> str:
        return f"nats:{self.subject}"

    def env(self) -> dict[str, str]:
        return {"NATS_URL": NATS_URL}

    def published(self) -> list[tuple[str, int]]:
        async def read(js: Any) -> list[tuple[str, int]]:
            stored = (await js.stream_info(self.stream)).state.messages
            from nats.js.api import AckPolicy, ConsumerConfig

            # Unacknowledged, so that no limit on pending acknowledgements stops the fetch.
            config = ConsumerConfig(ack_policy=AckPolicy.NONE)
            sub = await js.pull_subscribe(self.subject, stream=self.stream, config=config)
            got: list[tuple[str, int]] = []
            while len(got) < stored:
                for m in await sub.fetch(min(1000, stored - len(got)), timeout=10):
                    body = json.loads(m.data)
                    got.append((body["key"], body["seq"]))
            return got

        found: list[tuple[str, int]] = asyncio.run(self._call(read))
        return found

    def close(self) -> None:
        asyncio.run(self._call(lambda js: js.delete_stream(self.stream)))


async def _quiet(error: Exception) -> None:
    """nats-py logs each failed attempt unless given somewhere else to report it."""


class CeleryQueue(Broker):
    """Celery on Redis: the task calls wait in the queue's Redis list, oldest at the right,
    which is the order a Celery worker takes them in."""

    sink = "celery"

    def __init__(self) -> None:
        pytest.importorskip("celery", reason="pip install 'pgqueue[celery]'")
        redis = pytest.importorskip("redis", reason="pip install 'pgqueue[redis]'")
        self.client = redis.Redis.from_url(CELERY_BROKER)
        try:
            self.client.ping()
        except redis.exceptions.ConnectionError as exc:
            pytest.skip(f"no Redis at {CELERY_BROKER} for Celery's broker ({exc})")
        self.queue = f"pgqueue-order-{uuid.uuid4().hex[:8]}"

    def destination(self) -> str:
        return "celery:shop.record_order"

    def env(self) -> dict[str, str]:
        return {"CELERY_TEST_BROKER": CELERY_BROKER, "CELERY_TEST_QUEUE": self.queue}

    def message(self, key: str, seq: int) -> Any:
        return {"args": [key, seq]}

    def published(self) -> list[tuple[str, int]]:
        got = []
        for raw in reversed(self.client.lrange(self.queue, 0, -1)):
            args, _, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
            got.append((args[0], args[1]))
        return got

    def close(self) -> None:
        self.client.delete(self.queue)
        self.client.close()


BROKERS = {b.sink: b for b in (RedisStream, RabbitQueue, NatsStream, CeleryQueue)}


@pytest.fixture(params=list(BROKERS))
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    made = BROKERS[request.param]()
    yield made
    made.close()


class Ledger:
    """The next sequence number of each key, and the ids of the messages committed."""

    def __init__(self) -> None:
        self.next = {f"{half}{n}": 0 for half in "sp" for n in range(KEYS)}
        self.committed = 0
        self.ids: list[int] = []  # committed, in id order
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def take(self, key: str) -> list[int]:
        with self.lock:
            first = self.next[key]
            self.next[key] = first + MESSAGES
        return list(range(first, first + MESSAGES))

    def done(self, ids: list[int]) -> None:
        with self.lock:
            self.committed += len(ids)
            for n in ids:
                bisect.insort(self.ids, n)

    def published(self, conn: psycopg.Connection[Any], schema: str, ids: list[int]) -> bool:
        """Whether the relay has published (and deleted) any of `ids`."""
        query = f"SELECT count(*) FROM {schema}.outbox WHERE id = ANY(%s)"
        return int(conn.execute(query, [ids]).fetchone()[0]) < len(ids)  # type: ignore[index]

    def passed(self, conn: psycopg.Connection[Any], schema: str, staged: int) -> bool:
        """Whether the relay has published a message staged after `staged` by a
        transaction that committed meanwhile."""
        with self.lock:
            later = self.ids[bisect.bisect(self.ids, staged) :][:50]
        return bool(later) and self.published(conn, schema, later)


def stage(
    dsn: str, schema: str, broker: Broker, me: int, ledger: Ledger, done: threading.Event
) -> None:
    """A straddling connection (even `me`) waits, after its transaction's first statement,
    until the relay has published a later message of another transaction, and only then
    stages the rest: its ids straddle where the relay has read. The others stage on their
    own keys until the straddling ones are done, so that there is always a later message,
    each transaction once its previous one is published, so that the relay keeps up."""
    queue = Queue(schema=schema)
    straddles = me % 2 == 0
    ids: list[int] = []
    with psycopg.connect(dsn) as conn:
        for t in range(TRANSACTIONS if straddles else 100 * TRANSACTIONS):
            if not straddles:
                if done.is_set():
                    return
                if ids:
                    wait_until(partial(ledger.published, conn, schema, ids[-1:]),
                               what="the relay to publish the previous transaction")  # fmt: skip
                    conn.rollback()  # the check's transaction
            key = f"{'s' if straddles else 'p'}{(me * 5 + t) % KEYS}"
            ids = []
            with conn.transaction():
                # One key's transactions one at a time: their commit order is the order
                # they took their sequence numbers in.
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                             [f"{schema}:{key}"])  # fmt: skip
                for statement in range(STATEMENTS):
                    messages = [
                        Message(destination=broker.destination(), key=key,
                                message=broker.message(key, seq), message_id=f"{key}-{seq}")
                        for seq in ledger.take(key)
                    ]  # fmt: skip
                    ids += queue.stage_many(messages, conn=conn)
                    if straddles and statement == 0:
                        wait_until(partial(ledger.passed, conn, schema, ids[0]),
                                   what="the relay to publish past this transaction")  # fmt: skip
            ledger.done(ids)


def staging(*args: Any) -> None:
    """stage(), its failure kept for the test to report."""
    try:
        stage(*args)
    except BaseException as exc:
        args[3].errors.append(exc)
        raise


def relay_process(dsn: str, schema: str, broker: Broker, log: Path) -> Any:
    env = env_without_dsn({"RELAY_SINKS": broker.sink, "RELAY_BATCH": "50"} | broker.env())
    with open(log, "a") as logged:
        return subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "relay", "tests.apps.relay_app:relay",
             "--dsn", dsn, "--schema", schema, "--log-level", "debug"],
            cwd=ROOT, env=env, stdout=logged, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def out_of_order(published: list[tuple[str, int]]) -> list[str]:
    """Each message whose first publication came after a later one of its key."""
    seen: set[tuple[str, int]] = set()
    highest: dict[str, int] = {}
    wrong = []
    for key, seq in published:
        if (key, seq) in seen:
            continue  # published again after a kill: at least once
        seen.add((key, seq))
        if seq < highest.get(key, -1):
            wrong.append(f"{key}-{seq} after {key}-{highest[key]}")
        highest[key] = max(seq, highest.get(key, -1))
    return wrong


@pytest.mark.parametrize("kills", [0, 3], ids=["steady", "killed"])
def test_one_keys_messages_keep_commit_and_staging_order_under_concurrent_staging(
    dsn: str, schema: str, broker: Broker, kills: int, tmp_path: Path
) -> None:
    log = tmp_path / "relay.log"
    ledger = Ledger()
    relay = relay_process(dsn, schema, broker, log)
    done = threading.Event()
    stagers = [
        threading.Thread(target=staging, args=(dsn, schema, broker, me, ledger, done))
        for me in range(CONNECTIONS)
    ]

    def relayed() -> int:
        with psycopg.connect(dsn) as conn:
            return ledger.committed - count(conn, schema, "outbox", "status = 'staged'")

    try:
        for thread in stagers:
            thread.start()
        for k in range(1, kills + 1):  # mid-stream, with a batch in flight
            wait_until(lambda k=k: relayed() >= k * 200, what=f"kill {k}")
            relay.send_signal(signal.SIGKILL)
            relay.wait(30)
            relay = relay_process(dsn, schema, broker, log)
        for thread in stagers[::2]:
            thread.join(120)
        done.set()
        for thread in stagers[1::2]:
            thread.join(120)
        assert not any(thread.is_alive() for thread in stagers)
        assert not ledger.errors, ledger.errors
        wait_until(lambda: relayed() == ledger.committed, timeout=120, what="the relay to drain")
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(30)
    published = broker.published()
    assert set(published) == {(key, seq) for key, last in ledger.next.items()
                              for seq in range(last)}  # fmt: skip
    wrong = out_of_order(published)
    assert not wrong, f"{len(wrong)} of {ledger.committed} out of order, e.g. {wrong[:5]}"
