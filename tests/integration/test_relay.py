"""The outbox and `pgqueue relay`: messages staged in the caller's transaction, published by
real relay processes to a real Redis (Streams), deleted only once confirmed. What must hold:
a rollback is never published; every committed message is; one key's messages keep their
commit order; two relays never both publish; a relay killed with SIGKILL loses nothing; a
message the broker refuses for good is a dead letter that can be retried."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import AsyncQueue, ConfigurationError, InvalidArgumentsError, Message, Queue
from pgqueue.relay import Relay
from pgqueue.sinks import CallableSink, Outgoing, Refused
from tests.conftest import ROOT, count, env_without_dsn, relay_until, wait_until

redis = pytest.importorskip("redis", reason="pip install redis (the dev extra has it)")
REDIS_URL = os.environ.get("PGQUEUE_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="module")
def broker() -> Any:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL} ({exc}): .ci/run starts one")
    return client


@pytest.fixture
def stream(broker: Any) -> Iterator[str]:
    name = f"pgqueue-test-{uuid.uuid4().hex[:10]}"
    yield name
    broker.delete(name)


def relay_process(dsn: str, schema: str, log: Path, out: Path, batch: int = 100) -> Any:
    env = env_without_dsn(
        {"RELAY_FILE": str(out), "REDIS_URL": REDIS_URL, "RELAY_BATCH": str(batch)}
    )
    with open(log, "a") as logged:
        return subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "relay", "tests.apps.relay_app:relay",
             "--dsn", dsn, "--schema", schema, "--log-level", "debug"],
            cwd=ROOT, env=env, stdout=logged, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip


def entries(broker: Any, stream: str) -> list[dict[str, Any]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()} for _, fields in broker.xrange(stream)
    ]


def staged(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        return count(conn, schema, "outbox", "status = 'staged'")


def test_only_committed_messages_are_published_and_then_deleted(
    queue: Queue, dsn: str, schema: str, broker: Any, stream: str, tmp_path: Path
) -> None:
    with psycopg.connect(dsn) as conn:
        queue.stage(f"redis:{stream}", {"order": 1}, key="o1", conn=conn)
        conn.commit()
        queue.stage(f"redis:{stream}", {"order": 2}, key="o2", conn=conn)
        conn.rollback()  # never published
        with conn.transaction():
            queue.stage(f"redis:{stream}", {"order": 3}, key="o3", conn=conn)
            with pytest.raises(RuntimeError), conn.transaction():  # a savepoint
                queue.stage(f"redis:{stream}", {"order": 4}, conn=conn)
                raise RuntimeError("this step failed")
    proc = relay_process(dsn, schema, tmp_path / "relay.log", tmp_path / "out.jsonl")
    try:
        wait_until(lambda: len(entries(broker, stream)) >= 2 and staged(dsn, schema) == 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "relay.log").read_text()
    # Different keys, different lanes: no order between them.
    published = sorted(entries(broker, stream), key=lambda e: e["key"])
    assert [json.loads(e["message"]) for e in published] == [{"order": 1}, {"order": 3}]
    assert [e["key"] for e in published] == ["o1", "o3"]
    with psycopg.connect(dsn) as conn:
        assert count(conn, schema, "outbox") == 0  # deleted once confirmed


def test_ten_thousand_committed_messages_are_all_published_in_key_order(
    queue: Queue, dsn: str, schema: str, broker: Any, stream: str, tmp_path: Path
) -> None:
    proc = relay_process(dsn, schema, tmp_path / "relay.log", tmp_path / "out.jsonl", batch=500)
    try:
        with psycopg.connect(dsn) as conn:
            for t in range(100):  # staged while the relay runs, 100 per transaction
                queue.stage_many(
                    [
                        Message(
                            destination=f"redis:{stream}",
                            message={"n": t * 100 + i},
                            key=f"k{(t * 100 + i) % 37}",
                            message_id=f"m{t * 100 + i}",
                        )
                        for i in range(100)
                    ],
                    conn=conn,
                )
                conn.commit()
        wait_until(lambda: staged(dsn, schema) == 0, timeout=120)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "relay.log").read_text()
    published = entries(broker, stream)
    assert len(published) == 10_000
    assert {e["id"] for e in published} == {f"m{n}" for n in range(10_000)}
    by_key: dict[str, list[int]] = {}
    for e in published:
        by_key.setdefault(e["key"], []).append(json.loads(e["message"])["n"])
    assert len(by_key) == 37
    assert all(ns == sorted(ns) for ns in by_key.values())


def test_a_second_relay_stands_by_and_takes_over_from_a_killed_one(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    out = tmp_path / "out.jsonl"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = relay_process(dsn, schema, first_log, out, batch=50)
    second = None
    total = [0]

    def produce() -> None:
        with psycopg.connect(dsn) as conn:
            while total[0] < 3000:
                queue.stage_many(
                    [
                        Message(destination="file:x", message=total[0] + i,
                                key=f"k{(total[0] + i) % 5}", message_id=str(total[0] + i))
                        for i in range(20)
                    ],
                    conn=conn,
                )  # fmt: skip
                conn.commit()
                total[0] += 20

    producer = threading.Thread(target=produce)
    try:
        wait_until(lambda: "relay leads" in first_log.read_text(), what="the first to lead")
        second = relay_process(dsn, schema, second_log, out, batch=50)
        wait_until(lambda: "standing by" in second_log.read_text(), what="a standby")
        producer.start()
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 1000)
        first.send_signal(signal.SIGKILL)  # mid-stream: its batch in flight is unconfirmed
        first.wait(30)
        producer.join(120)
        wait_until(lambda: staged(dsn, schema) == 0, timeout=120, what="the standby to drain")
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    assert total[0] == 3000
    assert "relay leads" in second_log.read_text()  # it took over
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [int(line["id"]) for line in lines]
    assert set(ids) == set(range(3000))  # nothing lost
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 50  # at most the killed relay's batch in flight, published again
    for key in {line["key"] for line in lines}:
        firsts = list(dict.fromkeys(int(line["id"]) for line in lines if line["key"] == key))
        assert firsts == sorted(firsts), key  # first publications keep the key's order


def test_a_refused_message_is_a_dead_letter_with_its_reason_until_retried(
    queue: Queue, dsn: str, schema: str, broker: Any, stream: str, tmp_path: Path
) -> None:
    broker.set(stream, "not a stream")  # XADD to it fails: WRONGTYPE
    with psycopg.connect(dsn, autocommit=True) as conn:
        refused = queue.stage(f"redis:{stream}", {"n": 1}, conn=conn)
        nowhere = queue.stage("nosink:x", {"n": 2}, conn=conn)
    proc = relay_process(dsn, schema, tmp_path / "relay.log", tmp_path / "out.jsonl")
    try:
        wait_until(lambda: queue.outbox_stats().dead == 2)
        dead = {d.id: d for d in queue.dead_messages()}
        with pytest.raises(ConfigurationError, match="limit is a whole number"):
            queue.dead_messages(limit=0)
        with pytest.raises(ConfigurationError, match="message ids are whole numbers"):
            queue.retry_messages([0])
        assert "WRONGTYPE" in (dead[refused].error or "")
        assert "no sink named 'nosink'" in (dead[nowhere].error or "")
        broker.delete(stream)
        assert queue.retry_messages([refused]) == 1
        wait_until(lambda: len(entries(broker, stream)) == 1)
        wait_until(lambda: queue.outbox_stats().staged == 0, what="the confirmed one deleted")
        assert queue.outbox_stats().dead == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "relay.log").read_text()
    shown = subprocess.run(
        [sys.executable, "-m", "pgqueue", "outbox", "--dead", "--dsn", dsn, "--schema", schema],
        cwd=ROOT, env=env_without_dsn(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0 and "nosink:x" in shown.stdout and "no sink named" in shown.stdout


def test_a_broker_that_fails_for_a_while_is_retried_and_loses_nothing(
    queue: Queue, dsn: str, schema: str
) -> None:
    handed: list[int] = []
    failures = [3]

    def flaky(message: Outgoing) -> None:
        if failures[0] > 0:
            failures[0] -= 1
            raise ConnectionError("broker restarting")
        handed.append(message.message)

    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.stage_many(
            [Message(destination="flaky:x", message=n, key="one") for n in range(10)], conn=conn
        )
    relay = Relay({"flaky": CallableSink(flaky)}, dsn=dsn, schema=schema, retry_base=_ms(10))

    relay_until(relay, lambda: relay.stats.published >= 10)
    assert handed == list(range(10))  # in order, each once, after three failed attempts
    assert relay.stats.failed_attempts == 3
    assert staged(dsn, schema) == 0


def test_a_refusing_callable_and_async_staging(queue: Queue, dsn: str, schema: str) -> None:
    async def stage() -> list[int]:
        aq = AsyncQueue(dsn=dsn, schema=schema)
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                ids = [await aq.stage("picky:x", {"size": "huge"}, conn=conn)]
                ids += await aq.stage_many([Message(destination="picky:x", message=1)], conn=conn)
                await conn.commit()
            return ids
        finally:
            await aq.close()

    def picky(message: Outgoing) -> None:
        if message.message == {"size": "huge"}:
            raise Refused("too large for the broker")

    huge, small = asyncio.run(stage())
    relay = Relay({"picky": CallableSink(picky)}, dsn=dsn, schema=schema)

    relay_until(relay, lambda: relay.stats.published + relay.stats.refused >= 2)
    (dead,) = queue.dead_messages()
    assert (dead.id, dead.error) == (huge, "too large for the broker")
    assert relay.stats.published == 1 and small != huge


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda q, c: q.stage("redis", {}, conn=c), "destination"),
        (lambda q, c: q.stage("redis:s", {1, 2}, conn=c), "is not JSON"),
        (lambda q, c: q.stage("redis:s", float("nan"), conn=c), "is not JSON"),
        (lambda q, c: q.stage("redis:s", "a\x00b", conn=c), "NUL character"),
        (lambda q, c: q.stage("redis:s", 1, key="a\x00", conn=c), "NUL character"),
        (lambda q, c: q.stage("redis:s", "\ud800", conn=c), "is not JSON"),
        (lambda q, c: q.stage("redis:s", 1, headers={"a": 1}, conn=c), "headers"),
        (lambda q, c: q.stage("redis:s", "x" * 2_000_000, conn=c), "max_payload_bytes"),
    ],
)
def test_bad_messages_are_refused_and_nothing_is_staged(
    dsn: str, schema: str, call: Any, says: str
) -> None:
    small = Queue(schema=schema, max_payload_bytes=1024 * 1024)
    with psycopg.connect(dsn) as conn:
        with pytest.raises(InvalidArgumentsError, match=says):
            call(small, conn)
        conn.rollback()
        assert count(conn, schema, "outbox") == 0


def _ms(n: int) -> Any:
    from datetime import timedelta

    return timedelta(milliseconds=n)


def test_a_relay_whose_session_is_terminated_reconnects_and_goes_on(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    """What a relay sees of a PostgreSQL restart: its session gone mid-stream."""
    out = tmp_path / "out.jsonl"
    log = tmp_path / "relay.log"
    proc = relay_process(dsn, schema, log, out)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            queue.stage_many([Message(destination="file:x", message=n) for n in range(100)],
                             conn=conn)  # fmt: skip
            wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 100)
            # Published is not yet deleted: a session ended in between would rightly publish
            # the batch again, which the kill tests cover.
            wait_until(lambda: queue.outbox_stats().staged == 0, what="the first 100 deleted")
            ended = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name LIKE 'pgqueue relay %'"
            ).fetchone()
            assert ended == (1,)
            queue.stage_many(
                [Message(destination="file:x", message=n) for n in range(100, 200)], conn=conn
            )
            wait_until(lambda: len(out.read_text().splitlines()) >= 200, what="the second 100")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    published = sorted(json.loads(line)["message"] for line in out.read_text().splitlines())
    assert published == list(range(200))
    assert "reconnecting" in log.read_text()


def test_pgqueue_status_shows_the_outbox_and_each_relay(
    queue: Queue, dsn: str, schema: str, tmp_path: Path
) -> None:
    def status() -> dict[str, Any]:
        shown = subprocess.run(
            [sys.executable, "-m", "pgqueue", "status", "--json", "--dsn", dsn, "--schema",
             schema],
            cwd=ROOT, env=env_without_dsn(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        report: dict[str, Any] = json.loads(shown.stdout)
        return report

    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.stage_many([Message(destination="file:x", message=n) for n in range(50)], conn=conn)
        queue.stage("nosink:x", {"n": 1}, conn=conn)
    out = tmp_path / "out.jsonl"
    relays = [relay_process(dsn, schema, tmp_path / "first.log", out)]
    try:
        wait_until(lambda: staged(dsn, schema) == 0)
        relays.append(relay_process(dsn, schema, tmp_path / "second.log", out))
        wait_until(
            lambda: (
                [(r["leading"], r["published"]) for r in status()["relays"]]
                == [(True, 50), (False, 0)]
            ),
            what="the leader's count and the standby in status",
        )
        report = status()
        assert (report["outbox"]["staged"], report["outbox"]["dead"]) == (0, 1)
        assert report["relays"][0]["refused"] == 1
        assert report["relays"][0]["pid"] == relays[0].pid
    finally:
        for proc in relays:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    assert status()["relays"] == []  # a relay that stops takes its row with it


class FakeKafkaProducer:
    """Stands in for a Kafka client's producer, since no Kafka server runs here: `send`
    returns a future that the delivery report settles, as kafka-python's and
    confluent-kafka's do. The first send times out, as a broker leader election would."""

    def __init__(self) -> None:
        from collections import defaultdict

        self.topics: dict[str, list[tuple[str | None, bytes, dict[str, str]]]] = defaultdict(list)
        self.timeouts = 1

    def send(self, topic: str, key: str | None, value: bytes, headers: dict[str, str]) -> Any:
        from concurrent.futures import Future

        delivered: Future[int] = Future()
        if self.timeouts:
            self.timeouts -= 1
            delivered.set_exception(TimeoutError("delivery report timed out"))
        else:
            self.topics[topic].append((key, value, headers))
            delivered.set_result(len(self.topics[topic]) - 1)  # the offset
        return delivered


def test_kafka_through_a_callable_sink_with_its_producer(
    queue: Queue, dsn: str, schema: str
) -> None:
    producer = FakeKafkaProducer()

    def to_kafka(message: Outgoing) -> None:
        value = json.dumps(message.message).encode()
        headers = {"message-id": message.message_id}
        producer.send(message.target, message.key, value, headers).result(timeout=10)

    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.stage_many(
            [Message(destination="kafka:orders", message={"n": n}, key=f"c{n % 2}")
             for n in range(20)],
            conn=conn,
        )  # fmt: skip
    relay = Relay({"kafka": CallableSink(to_kafka)}, dsn=dsn, schema=schema, retry_base=_ms(10))

    relay_until(relay, lambda: relay.stats.published >= 20)
    records = producer.topics["orders"]
    assert sorted(json.loads(value)["n"] for _, value, _ in records) == list(range(20))
    for key in ("c0", "c1"):  # each customer's records in order on the topic
        mine = [json.loads(value)["n"] for k, value, _ in records if k == key]
        assert mine == sorted(mine)
    assert all(headers["message-id"] for _, _, headers in records)
    assert relay.stats.failed_attempts == 1 and staged(dsn, schema) == 0
