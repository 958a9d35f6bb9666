"""The relay's sinks against the real brokers on this machine: RabbitMQ (publisher
confirms, mandatory routing), NATS JetStream (Nats-Msg-Id dedupe) and Celery (a real Celery
worker process runs the relayed task calls). Each skips, saying why, when its broker or
client is absent; .ci/run has them all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Message, Queue
from pgqueue.relay import Relay
from pgqueue.sinks import Sink
from tests.conftest import ROOT, count, env_without_dsn, relay_until, wait_until

RABBIT_URL = os.environ.get("PGQUEUE_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("PGQUEUE_TEST_NATS", "nats://127.0.0.1:4222")
REDIS_URL = "redis://127.0.0.1:6379/15"


def stage(queue: Queue, dsn: str, messages: list[Message]) -> list[int]:
    with psycopg.connect(dsn) as conn:
        ids = queue.stage_many(messages, conn=conn)
        conn.commit()
    return ids


def settled(dsn: str, schema: str) -> Callable[[], bool]:
    def check() -> bool:
        with psycopg.connect(dsn) as conn:
            return count(conn, schema, "outbox", "status = 'staged'") == 0

    return check


def test_rabbitmq_confirms_every_message_and_refuses_an_unroutable_one(
    queue: Queue, dsn: str, schema: str
) -> None:
    aio_pika = pytest.importorskip("aio_pika", reason="pip install 'pgqueue-py[rabbitmq]'")
    from pgqueue.sinks.rabbitmq import RabbitMQ

    name = f"pgqueue-test-{uuid.uuid4().hex[:8]}"

    async def declare() -> None:
        connection = await aio_pika.connect(RABBIT_URL)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(name, durable=True, auto_delete=False)

    try:
        asyncio.run(declare())
    except (OSError, aio_pika.exceptions.AMQPConnectionError) as exc:
        pytest.skip(f"no RabbitMQ at {RABBIT_URL} ({exc}): .ci/run needs one")
    ids = stage(
        queue,
        dsn,
        [
            Message(destination=f"rabbitmq:/{name}", message={"n": n}, key=f"k{n % 3}")
            for n in range(200)
        ]
        + [Message(destination="rabbitmq:amq.direct/no-such-binding", message={"n": -1})],
    )
    sink: Sink = RabbitMQ(RABBIT_URL)
    relay = Relay({"rabbitmq": sink}, dsn=dsn, schema=schema)
    relay_until(relay, settled(dsn, schema))

    async def drain() -> list[Any]:
        connection = await aio_pika.connect(RABBIT_URL)
        got = []
        async with connection:
            channel = await connection.channel()
            q = await channel.get_queue(name)
            while (message := await q.get(no_ack=True, fail=False)) is not None:
                got.append(message)
            await q.delete(if_unused=False, if_empty=False)
        return got

    got = asyncio.run(drain())
    numbers = [json.loads(m.body)["n"] for m in got]
    assert sorted(numbers) == list(range(200))
    for key in ("k0", "k1", "k2"):  # each key in its order; keys interleave
        mine = [json.loads(m.body)["n"] for m in got if m.headers["key"] == key]
        assert mine == sorted(mine) and len(mine) > 60
    assert sorted(int(m.message_id) for m in got) == ids[:200]
    assert all(m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT for m in got)
    (dead,) = queue.dead_messages()
    assert dead.id == ids[-1] and "NO_ROUTE" in (dead.error or "")


def test_nats_jetstream_stores_each_message_once_by_its_id(
    queue: Queue, dsn: str, schema: str
) -> None:
    nats = pytest.importorskip("nats", reason="pip install 'pgqueue-py[nats]'")
    from pgqueue.sinks.nats import NatsJetStream

    stream = f"PGQ_TEST_{uuid.uuid4().hex[:8].upper()}"
    subject = f"pgqtest.{stream.lower()}"

    async def quiet(error: Exception) -> None:
        """nats-py logs each failed attempt unless given somewhere else to report it."""

    async def create() -> None:
        # One attempt: a NATS that is not there skips the test at once, quietly.
        client = await nats.connect(NATS_URL, max_reconnect_attempts=1, error_cb=quiet)
        await client.jetstream().add_stream(name=stream, subjects=[f"{subject}.>"])
        await client.close()

    try:
        asyncio.run(create())
    except Exception as exc:  # nats-py raises its own and OSError kinds
        pytest.skip(f"no NATS JetStream at {NATS_URL} ({exc}): .ci/run needs one")
    messages = [
        Message(destination=f"nats:{subject}.orders", message={"n": n}, message_id=f"order-{n}")
        for n in range(100)
    ]
    # The same message id staged again: JetStream's dedupe window keeps one.
    messages.append(Message(destination=f"nats:{subject}.orders", message={"n": 0},
                            message_id="order-0"))  # fmt: skip
    messages.append(Message(destination="nats:nobody.listens.here", message={"n": -1}))
    ids = stage(queue, dsn, messages)
    relay = Relay({"nats": NatsJetStream(NATS_URL)}, dsn=dsn, schema=schema)
    relay_until(relay, settled(dsn, schema))

    async def read() -> tuple[int, list[Any]]:
        client = await nats.connect(NATS_URL)
        js = client.jetstream()
        info = await js.stream_info(stream)
        sub = await js.pull_subscribe(f"{subject}.>", durable=None, stream=stream)
        got = await sub.fetch(info.state.messages, timeout=5)
        await js.delete_stream(stream)
        await client.close()
        return info.state.messages, got

    stored, got = asyncio.run(read())
    assert stored == 100
    assert [json.loads(m.data)["n"] for m in got] == list(range(100))
    assert [m.headers["Nats-Msg-Id"] for m in got] == [f"order-{n}" for n in range(100)]
    (dead,) = queue.dead_messages()
    assert dead.id == ids[-1] and "no stream captures" in (dead.error or "")


def test_a_real_celery_worker_runs_the_relayed_task_calls_once_each(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    pytest.importorskip("celery", reason="pip install 'pgqueue-py[celery]'")
    redis = pytest.importorskip("redis", reason="pip install redis")
    results = f"pgqueue-celery-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} for Celery's broker ({exc}): .ci/run starts one")
    env = env_without_dsn({"CELERY_TEST_BROKER": REDIS_URL, "CELERY_TEST_LIST": results})
    os.environ["CELERY_TEST_LIST"] = results
    from pgqueue.sinks.celery import CelerySink
    from tests.apps import celery_app

    celery_app.RESULTS = results
    ids = stage(
        queue,
        dsn,
        [
            Message(destination="celery:shop.record_order",
                    message={"args": [n], "kwargs": {"note": f"n{n}"}})
            for n in range(50)
        ],
    )  # fmt: skip
    relay = Relay({"celery": CelerySink(celery_app.app)}, dsn=dsn, schema=schema)
    relay_until(relay, settled(dsn, schema))
    with open(tmp_path / "celery.log", "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.apps.celery_app", "worker",
             "--pool", "solo", "--concurrency", "1", "--without-heartbeat", "--without-gossip",
             "--without-mingle", "--loglevel", "WARNING"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: client.llen(results) >= 50, timeout=120)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    ran = [json.loads(line) for line in client.lrange(results, 0, -1)]
    client.delete(results)
    assert sorted(r["order"] for r in ran) == list(range(50))
    assert {r["task_id"] for r in ran} == {str(i) for i in ids}  # the message id is the task id
    assert all(r["note"] == f"n{r['order']}" for r in ran)
