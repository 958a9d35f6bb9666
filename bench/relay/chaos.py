"""The relay under faults: SIGKILL of the publishing relay every few seconds and a broker
restart, while messages flow. Counts what reached the broker against what was committed.

    python -m bench relay-chaos [--dsn DSN] [--messages 50000] [--keys 100] [--batch 200]
                                [--kill-every 3] [--rate 1000] [--out DIR] [--short]

A redis-server of the bench's own (append-only file, fsync on every write, so that what it
confirmed survives its restart) on a free port; two `pgqueue relay` processes
(bench/relay/app.py), one leading and one standing by; one producer staging --messages
messages over --keys keys, 20 to a transaction, at most --rate a second, each with its
sequence number as its message id and its place in its key. Every --kill-every seconds the
leading relay is killed with SIGKILL and started again (the standby takes over meanwhile);
half way through, the broker is stopped and started again. Then the stream is read:
- lost: committed message ids not in the stream (must be 0);
- duplicates: entries beyond one per id (bounded by the batches in flight at the kills);
- reordered: messages whose key had a later one published first (first publications only;
  must be 0).

Writes results.json to its results folder (bench/report.py) and prints a summary. Exits 1
if anything was lost or reordered.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Message, Queue

ROOT = Path(__file__).resolve().parents[2]
PER_TRANSACTION = 20


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "relay-chaos",
        __doc__.split("\n\n")[0],
        short="the CI run: 5,000 messages, kills every 0.5 s",
    )
    parser.add_argument("--messages", type=int, help="messages staged (default 50000)")
    parser.add_argument("--keys", type=int, default=100, help="ordering keys (100)")
    parser.add_argument("--batch", type=int, default=200, help="the relay's batch size (200)")
    parser.add_argument(
        "--kill-every", type=float, help="seconds between kills of the leader (default 3)"
    )
    parser.add_argument(
        "--rate", type=int, help="messages staged per second, at most (default 1000)"
    )
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"messages": 5000, "kill_every": 0.5, "rate": 2500},
        full={"messages": 50_000, "kill_every": 3.0, "rate": 1000},
    )
    options.positive(
        parser,
        {"--messages": args.messages, "--keys": args.keys, "--batch": args.batch,
         "--kill-every": args.kill_every, "--rate": args.rate},
    )  # fmt: skip
    return args


class Broker:
    """A redis-server of the bench's own, durable across its restart."""

    def __init__(self, folder: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise SystemExit(
                "relay-chaos needs redis-server (Debian: apt-get install redis-server)"
            )
        self.folder = folder
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.folder), "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        client = redis.Redis.from_url(self.url)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)  # it writes its file and exits
            self.proc.wait(30)
            self.proc = None


def relay_process(dsn: str, schema: str, broker: Broker, batch: int, log: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if k not in ("PGQUEUE_DSN", "DATABASE_URL")}
    env |= {"RELAY_REDIS_URL": broker.url, "RELAY_BATCH": str(batch)}
    with open(log, "a") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "relay", "bench.relay.app:relay", "--dsn", dsn,
             "--schema", schema],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def leader_pid(dsn: str) -> int | None:
    """The process id of the relay holding the lead: its session's name carries it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT a.application_name FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)"
            " WHERE l.locktype = 'advisory' AND l.granted"
            " AND a.application_name LIKE 'pgqueue relay %'"
        ).fetchone()
    return int(str(row[0]).rsplit(" ", 1)[1]) if row else None


def produce(dsn: str, schema: str, args: argparse.Namespace, done: list[int]) -> None:
    queue = Queue(schema=schema)
    began = time.monotonic()
    with psycopg.connect(dsn) as conn:
        for start in range(0, args.messages, PER_TRANSACTION):
            ahead = start / args.rate - (time.monotonic() - began)
            if ahead > 0:  # keep to the rate, so the kills fall while messages flow
                time.sleep(ahead)
            batch = [
                Message(
                    destination="redis:chaos",
                    message={"seq": n, "key": f"k{n % args.keys}", "nth": n // args.keys},
                    key=f"k{n % args.keys}",
                    message_id=str(n),
                )
                for n in range(start, min(start + PER_TRANSACTION, args.messages))
            ]
            queue.stage_many(batch, conn=conn)
            conn.commit()
            done[0] += len(batch)


def count(entries: list[dict[str, Any]], expected: int) -> dict[str, Any]:
    seen = [int(e["id"]) for e in entries]
    first: dict[int, int] = {}
    for position, n in enumerate(seen):
        first.setdefault(n, position)
    reordered = 0
    last: dict[str, int] = {}
    for n in sorted(first, key=first.__getitem__):  # first publications, in order
        message = json.loads(entries[first[n]]["message"])
        key, nth = message["key"], message["nth"]
        if last.get(key, -1) > nth:
            reordered += 1
        last[key] = max(last.get(key, -1), nth)
    return {
        "committed": expected,
        "published_entries": len(seen),
        "lost": len(set(range(expected)) - set(seen)),
        "duplicates": len(seen) - len(set(seen)),
        "reordered": reordered,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded(
        "relay-chaos", lambda: bench(Run("relay-chaos", argv, args.out, args.short), args)
    )


def bench(run: Run, args: argparse.Namespace) -> int:
    import redis

    with (
        database(options.dsn(args.dsn)) as server,
        scratch_schema(server.dsn, "bench_relay") as schema,
        tempfile.TemporaryDirectory(prefix="pgqueue-relay-chaos-") as tmp,
    ):
        out = run.folder(server)
        broker = Broker(Path(tmp))
        broker.start()
        logs = Path(tmp)
        relays = [relay_process(server.dsn, schema, broker, args.batch, logs / f"r{i}.log")
                  for i in range(2)]  # fmt: skip
        produced = [0]
        producer = threading.Thread(target=produce, args=(server.dsn, schema, args, produced))
        kills, restarts = 0, 0
        started = time.monotonic()
        try:
            producer.start()
            next_kill = time.monotonic() + args.kill_every
            while producer.is_alive() or _staged(server.dsn, schema) > 0:
                if time.monotonic() - started > 900:
                    raise RuntimeError("the outbox did not drain in 15 minutes")
                if restarts == 0 and produced[0] >= args.messages // 2:
                    broker.stop()
                    time.sleep(2.0)  # the relay retries meanwhile
                    broker.start()
                    restarts += 1
                if time.monotonic() >= next_kill:
                    pid = leader_pid(server.dsn)
                    victim = next((r for r in relays if r.pid == pid), None)
                    if victim is not None:
                        victim.send_signal(signal.SIGKILL)
                        victim.wait(30)
                        relays[relays.index(victim)] = relay_process(
                            server.dsn, schema, broker, args.batch, logs / f"k{kills}.log"
                        )
                        kills += 1
                    next_kill = time.monotonic() + args.kill_every
                time.sleep(0.05)
            seconds = time.monotonic() - started
            producer.join()
        finally:
            for proc in relays:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
            client = redis.Redis.from_url(broker.url)
            entries = [
                {k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in client.xrange("chaos")
            ]
            broker.stop()
        figures = count(entries, args.messages) | {
            "keys": args.keys,
            "batch": args.batch,
            "kill_every_s": args.kill_every,
            "leader_kills": kills,
            "broker_restarts": restarts,
            "seconds": round(seconds, 1),
            "duplicates_bound": kills * args.batch,
        }
        run.write(out, "results.json", server, figures)
    print(
        f"PostgreSQL {server.version}: {args.messages:,} messages over {args.keys} keys, the "
        f"leading relay killed {kills} times, the broker restarted {restarts} time(s), "
        f"{figures['seconds']} s"
    )
    print(
        f"lost {figures['lost']}, duplicates {figures['duplicates']} (bound {kills} kills x "
        f"batch {args.batch}), reordered within a key {figures['reordered']}"
    )
    print(f"written to {out}")
    return 1 if figures["lost"] or figures["reordered"] else 0


def _staged(dsn: str, schema: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.outbox WHERE status = 'staged'").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


if __name__ == "__main__":
    raise SystemExit(main())
