"""How fast the relay publishes to each broker, against a bare client of that broker in
the same run.

    python -m bench relay-throughput [--dsn DSN] [--messages 20000] [--brokers redis,rabbitmq,nats]
                                     [--out DIR] [--short]

For each broker on this machine (Redis 127.0.0.1:6379, RabbitMQ 127.0.0.1:5672, NATS
JetStream 127.0.0.1:4222; one that is not there is skipped and says so):
- relay: --messages messages over 100 keys are staged first, then a Relay (batch 500, 8
  lanes, in this process) publishes them all, confirmed and deleted; the time from its start
  to an empty outbox;
- bare: the broker's own client publishes the same messages with the same confirmation
  (Redis: pipelined XADD, 500 at a time; RabbitMQ: publisher confirms, 8 publishers at once;
  NATS: JetStream publish awaiting each ack, 8 publishers at once), and nothing else.
Messages per second of each, and relay / bare. Writes results.json to its results folder
(bench/report.py) and prints a summary.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Message, Queue
from pgqueue.relay import Relay
from pgqueue.sinks import Sink

BROKERS = ("redis", "rabbitmq", "nats")
LANES = 8
BATCH = 500


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "relay-throughput", __doc__.split("\n\n")[0], short="the CI run: 2,000 messages"
    )
    parser.add_argument("--messages", type=int, help="messages per broker (default 20000)")
    parser.add_argument("--brokers", default=",".join(BROKERS), help="which brokers")
    args = parser.parse_args(argv)
    args.brokers = options.choices(parser, "--brokers", args.brokers, BROKERS)
    options.sized(args, short={"messages": 2000}, full={"messages": 20_000})
    options.positive(parser, {"--messages": args.messages})
    return args


def payload(n: int) -> dict[str, Any]:
    return {"order": n, "customer": f"c{n % 100}", "total": n * 1.5, "items": ["tea", "jam"]}


async def _lanes(messages: Sequence[int], publish: Callable[[int], Awaitable[None]]) -> None:
    async def lane(mine: Sequence[int]) -> None:
        for n in mine:
            await publish(n)

    await asyncio.gather(*(lane(messages[i::LANES]) for i in range(LANES)))


class Broker(abc.ABC):
    """One broker: its sink for the relay, and the same publishing with its bare client."""

    name: str

    @abc.abstractmethod
    def sink(self) -> Sink: ...

    @abc.abstractmethod
    async def bare(self, count: int) -> None: ...

    @abc.abstractmethod
    async def received(self) -> int: ...

    async def cleanup(self) -> None:
        return None


class RedisBroker(Broker):
    name = "redis"

    def __init__(self) -> None:
        import redis.asyncio

        self.url = "redis://127.0.0.1:6379/0"
        self.client = redis.asyncio.from_url(self.url)
        self.stream = f"bench-relay-{uuid.uuid4().hex[:8]}"
        self.target = self.stream

    def sink(self) -> Sink:
        from pgqueue.sinks.redis import RedisStreams

        return RedisStreams(self.url)

    async def bare(self, count: int) -> None:
        stream = self.stream + "-bare"
        for start in range(0, count, BATCH):
            async with self.client.pipeline(transaction=False) as pipe:
                for n in range(start, min(start + BATCH, count)):
                    pipe.xadd(stream, {"id": str(n), "message": json.dumps(payload(n))})
                await pipe.execute()
        await self.client.delete(stream)

    async def received(self) -> int:
        return int(await self.client.xlen(self.stream))

    async def cleanup(self) -> None:
        await self.client.delete(self.stream)
        await self.client.aclose()


class RabbitBroker(Broker):
    name = "rabbitmq"

    def __init__(self) -> None:
        self.url = "amqp://guest:guest@127.0.0.1:5672/"
        self.queue = f"bench-relay-{uuid.uuid4().hex[:8]}"
        self.target = f"/{self.queue}"

    async def setup(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(self.url)
        channel = await self.connection.channel()
        await channel.declare_queue(self.queue, durable=True)
        await channel.declare_queue(self.queue + "-bare", durable=True)

    def sink(self) -> Sink:
        from pgqueue.sinks.rabbitmq import RabbitMQ

        return RabbitMQ(self.url)

    async def bare(self, count: int) -> None:
        import aio_pika

        channel = await self.connection.channel(publisher_confirms=True)

        async def publish(n: int) -> None:
            body = aio_pika.Message(
                json.dumps(payload(n)).encode(),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=str(n),
            )
            await channel.default_exchange.publish(
                body, routing_key=self.queue + "-bare", mandatory=True
            )

        await _lanes(range(count), publish)
        await channel.close()

    async def received(self) -> int:
        channel = await self.connection.channel()
        q = await channel.declare_queue(self.queue, durable=True, passive=True)
        n = q.declaration_result.message_count
        await channel.close()
        return int(n)

    async def cleanup(self) -> None:
        channel = await self.connection.channel()
        for name in (self.queue, self.queue + "-bare"):
            await channel.queue_delete(name)
        await self.connection.close()


class NatsBroker(Broker):
    name = "nats"

    def __init__(self) -> None:
        self.servers = "nats://127.0.0.1:4222"
        self.stream = f"BENCH_RELAY_{uuid.uuid4().hex[:8].upper()}"
        self.subject = f"benchrelay.{self.stream.lower()}"
        self.target = f"{self.subject}.relay"

    async def setup(self) -> None:
        import nats

        self.client = await nats.connect(self.servers)
        self.js = self.client.jetstream()
        await self.js.add_stream(name=self.stream, subjects=[f"{self.subject}.>"])

    def sink(self) -> Sink:
        from pgqueue.sinks.nats import NatsJetStream

        return NatsJetStream(self.servers)

    async def bare(self, count: int) -> None:
        async def publish(n: int) -> None:
            await self.js.publish(
                f"{self.subject}.bare",
                json.dumps(payload(n)).encode(),
                headers={"Nats-Msg-Id": f"bare-{n}"},
            )

        await _lanes(range(count), publish)

    async def received(self) -> int:
        info = await self.js.stream_info(self.stream)
        return int(info.state.messages)

    async def cleanup(self) -> None:
        await self.js.delete_stream(self.stream)
        await self.client.close()


async def _broker(name: str) -> Broker:
    made: Broker = {"redis": RedisBroker, "rabbitmq": RabbitBroker, "nats": NatsBroker}[name]()
    setup = getattr(made, "setup", None)
    if setup is not None:
        await setup()
    if name == "redis":
        await made.client.ping()  # type: ignore[attr-defined]
    return made


async def measure(dsn: str, schema: str, broker: Broker, count: int) -> dict[str, Any]:
    queue = Queue(schema=schema)
    with psycopg.connect(dsn) as conn:
        for start in range(0, count, 1000):
            queue.stage_many(
                [
                    Message(destination=f"{broker.name}:{broker.target}", message=payload(n),
                            key=f"k{n % 100}")
                    for n in range(start, min(start + 1000, count))
                ],
                conn=conn,
            )  # fmt: skip
            conn.commit()
    relay = Relay({broker.name: broker.sink()}, dsn=dsn, schema=schema, batch_size=BATCH,
                  publishers=LANES)  # fmt: skip
    began = time.perf_counter()
    task = asyncio.create_task(relay.run())
    while relay.stats.published + relay.stats.refused < count and not task.done():
        await asyncio.sleep(0.01)
    relay_s = time.perf_counter() - began
    relay.stop()
    await task
    received = await broker.received()
    began = time.perf_counter()
    await broker.bare(count)
    bare_s = time.perf_counter() - began
    relay_rate, bare_rate = count / relay_s, count / bare_s
    return {
        "messages": count,
        "relay_per_s": round(relay_rate),
        "bare_per_s": round(bare_rate),
        "relay_to_bare": round(relay_rate / bare_rate, 3),
        "refused": relay.stats.refused,
        "received": received,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    run = Run("relay-throughput", argv, args.out, args.short)
    return guarded("relay-throughput", lambda: bench(run, args))


def bench(run: Run, args: argparse.Namespace) -> int:
    figures: dict[str, Any] = {"lanes": LANES, "batch": BATCH, "brokers": {}}
    with database(options.dsn(args.dsn)) as server:
        out = run.folder(server)
        for name in args.brokers:
            with scratch_schema(server.dsn, "bench_relay") as schema:
                figures["brokers"][name] = asyncio.run(_one(server.dsn, schema, name, args))
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}: {args.messages:,} messages per broker")
    for name, f in figures["brokers"].items():
        if "skipped" in f:
            print(f"  {name:<9} skipped: {f['skipped']}")
        else:
            print(
                f"  {name:<9} relay {f['relay_per_s']:>7,}/s  bare client {f['bare_per_s']:>7,}/s"
                f"  ratio {f['relay_to_bare']:.2f}  ({f['received']:,} received)"
            )
    print(f"written to {out}")
    return 0


async def _one(dsn: str, schema: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    try:
        broker = await _broker(name)
    except Exception as exc:  # a broker that is not there
        return {"skipped": f"{type(exc).__name__}: {exc}"}
    try:
        return await measure(dsn, schema, broker, args.messages)
    finally:
        await broker.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
