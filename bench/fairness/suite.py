"""Fair shares across keys: quiet tenants beside a flood, shares against weights, claim cost.

    python -m bench fairness [--dsn DSN] [--backlog N] [--seconds S] [--out DIR] [--short]

Quiet tenants: one tenant ("flood") has --backlog queued jobs (stamped as one enqueue of
that key would stamp them); 99 others trickle one job each, round-robin, every 20 ms for
--seconds, while a Worker (concurrency 20, handlers sleep 5 ms) runs. Each job's wait is
from its enqueue to its handler's start. Reported: the quiet tenants' p50 and p99 waits,
against the same trickle with no flood queued (the control), and the flood's starts.

Shares: three keys of weights 1, 2 and 4, each with a backlog enqueued through the API
(stamped by fairness_stamp), drained by one worker (concurrency 1, batches of 5): the share
of the first 7 * --share-jobs starts each key got, against the share its weight owes it.

Claim cost at depth: job_claim_fair over --backlog fair jobs of one key, against job_claim
over as many plain jobs, batches of 100 from each statement's hint (as a worker claims),
the two taking turns; the median and p95 of each statement's time, and their ratio.

Writes fairness.json to its results folder (bench/report.py) and prints the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_schema
from pgqueue import Queue, Worker
from pgqueue.queries import query

QUIET = 99
TRICKLE_EVERY = 0.02
WEIGHTS = {"w1": 1, "w2": 2, "w4": 4}
BATCH = 100


def flood(dsn: str, schema: str, key: str, n: int, task: str = "work") -> None:
    """`n` queued fair jobs of `key`, stamped 0, 1, 2, ... as one enqueue of a key of weight
    1 on an idle queue is, and the key's and queue's clocks to match; straight in SQL."""
    s = sql.Identifier(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, args, fairness_key, vtime) "
                "SELECT 'default', %s, jsonb_build_object('tenant', %s::text, 'sent', 0), %s, "
                "g - 1 "
                "FROM generate_series(1, %s) AS g"
            ).format(s),
            [task, key, key, n],
        )
        conn.execute(
            sql.SQL("INSERT INTO {}.fairness_key_log VALUES ('default', %s, %s)").format(s),
            [key, float(n)],
        )
        conn.execute(sql.SQL("INSERT INTO {}.fairness_clocks VALUES ('default', 0)").format(s))
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(s))


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
    thread.start()
    try:
        yield
    finally:
        worker.stop(force=True)
        thread.join(timeout=120)


def quiet_waits(dsn: str, backlog: int, seconds: float) -> dict[str, Any]:
    with scratch_schema(dsn, "bench_fairness") as schema:
        queue = Queue(dsn, schema=schema)
        waits: list[float] = []
        flood_starts = 0
        lock = threading.Lock()

        @queue.task(name="work", fairness_key="{tenant}")
        async def work(tenant: str, sent: float) -> None:
            nonlocal flood_starts
            with lock:
                if tenant == "flood":
                    flood_starts += 1
                else:
                    waits.append(time.time() - sent)
            await asyncio.sleep(0.005)

        if backlog:
            flood(dsn, schema, "flood", backlog)
        worker = Worker(queue, dsn=dsn, schema=schema, concurrency=20)
        with running(worker):
            deadline = time.monotonic() + seconds
            i = 0
            while time.monotonic() < deadline:
                work.enqueue(f"quiet-{i % QUIET}", time.time())
                i += 1
                time.sleep(TRICKLE_EVERY)
            sent = i
            end = time.monotonic() + 60
            while len(waits) < sent and time.monotonic() < end:
                time.sleep(0.05)
        queue.close()
    ordered = sorted(waits)
    return {
        "backlog": backlog,
        "quiet_jobs": sent,
        "quiet_started": len(ordered),
        "wait_p50_s": statistics.median(ordered) if ordered else None,
        "wait_p99_s": ordered[int(0.99 * (len(ordered) - 1))] if ordered else None,
        "flood_started": flood_starts,
    }


def shares(dsn: str, per_key: int) -> dict[str, Any]:
    with scratch_schema(dsn, "bench_fairness") as schema:
        queue = Queue(dsn, schema=schema)
        order: list[str] = []

        @queue.task(name="share", fairness_key="{key}")
        def share(key: str, i: int) -> None:
            order.append(key)

        for key, weight in WEIGHTS.items():
            queue.set_fairness_weight(key, weight)
        for key in WEIGHTS:
            queue.enqueue_many([share.job(key, i) for i in range(per_key)])
        worker = Worker(queue, dsn=dsn, schema=schema, concurrency=1, batch_size=5)
        with running(worker):
            end = time.monotonic() + 600
            while len(order) < 7 * per_key // 5 and time.monotonic() < end:
                time.sleep(0.05)
        queue.close()
    first = Counter(order[: 7 * per_key // 5])  # all three keys stay backlogged
    total = sum(first.values())
    return {
        "first_starts": total,
        "shares": {k: first[k] / total for k in WEIGHTS},
        "owed": {k: w / sum(WEIGHTS.values()) for k, w in WEIGHTS.items()},
    }


def claim_cost(dsn: str, backlog: int, claims: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"fair": [], "plain": []}
    with (
        scratch_schema(dsn, "bench_fairness") as fair_s,
        scratch_schema(dsn, "bench_fairness") as plain_s,
    ):
        flood(dsn, fair_s, "flood", backlog, task="noop")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (queue, task, args) "
                    "SELECT 'default', 'noop', '{{}}' FROM generate_series(1, %s)"
                ).format(sql.Identifier(plain_s)),
                [backlog],
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(plain_s)))
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
            fair_after: tuple[int, float] = (-32768, float("-inf"))
            plain_after: tuple[int, int] = (-32768, 0)
            for _ in range(claims):
                params = {
                    "queue": "default",
                    "after_priority": fair_after[0],
                    "after_vtime": fair_after[1],
                    "before_priority": 32767,
                    "before_vtime": float("inf"),
                    "limit": BATCH,
                    "worker_id": 1,
                    "now": None,
                }
                t = time.perf_counter()
                rows = conn.execute(query("job_claim_fair", fair_s), params).fetchall()
                times["fair"].append(time.perf_counter() - t)
                fair_after = max((r[3], r[11]) for r in rows)
                params = {
                    "queue": "default",
                    "after_priority": plain_after[0],
                    "after_id": plain_after[1],
                    "before_priority": 32767,
                    "before_id": 2**63 - 1,
                    "limit": BATCH,
                    "worker_id": 1,
                    "now": None,
                }
                t = time.perf_counter()
                rows = conn.execute(query("job_claim", plain_s), params).fetchall()
                times["plain"].append(time.perf_counter() - t)
                plain_after = max((r[3], r[0]) for r in rows)
    out: dict[str, Any] = {"backlog": backlog, "claims": claims, "batch": BATCH}
    for name, seconds in times.items():
        ordered = sorted(seconds[1:])  # the first plans and warms the statement
        out[f"{name}_ms_p50"] = 1000 * statistics.median(ordered)
        out[f"{name}_ms_p95"] = 1000 * ordered[int(0.95 * (len(ordered) - 1))]
    out["fair_vs_plain_p50"] = out["fair_ms_p50"] / out["plain_ms_p50"]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = options.parser(
        "fairness", __doc__.splitlines()[0], short="CI-sized: 10,000 jobs, 3 s of trickle"
    )
    parser.add_argument("--backlog", type=int, default=1_000_000, help="the flood's jobs")
    parser.add_argument("--seconds", type=float, default=30.0, help="the trickle's duration")
    parser.add_argument("--share-jobs", type=int, default=2000, help="jobs per weighted key")
    parser.add_argument("--claims", type=int, default=200, help="claims per statement")
    args = parser.parse_args(argv)
    if args.short:
        args.backlog, args.seconds, args.share_jobs, args.claims = 10_000, 3.0, 400, 20
    options.positive(
        parser,
        {
            "--backlog": args.backlog,
            "--seconds": args.seconds,
            "--share-jobs": args.share_jobs,
            "--claims": args.claims,
        },
    )
    return guarded("fairness", lambda: bench(Run("fairness", argv, args.out, args.short), args))


def bench(run_: Run, args: argparse.Namespace) -> int:
    with database(options.dsn(args.dsn)) as server:
        out = run_.folder(server)
        result = {
            "quiet": quiet_waits(server.dsn, args.backlog, args.seconds),
            "quiet_control": quiet_waits(server.dsn, 0, args.seconds),
            "shares": shares(server.dsn, args.share_jobs),
            "claim_cost": claim_cost(server.dsn, args.backlog, args.claims),
            "postgres": server.version,
        }
        run_.write(out, "fairness.json", server, result)
    print_summary(result)
    print(f"wrote {out}/fairness.json", file=sys.stderr)
    return 0


def print_summary(result: dict[str, Any]) -> None:
    q, c = result["quiet"], result["quiet_control"]
    print(f"PostgreSQL {result['postgres']}")
    print(
        f"quiet tenants beside a flood of {q['backlog']}: wait p50 {q['wait_p50_s']:.3f} s, "
        f"p99 {q['wait_p99_s']:.3f} s ({q['quiet_started']}/{q['quiet_jobs']} started; flood "
        f"started {q['flood_started']}); no flood: p50 {c['wait_p50_s']:.3f} s, "
        f"p99 {c['wait_p99_s']:.3f} s"
    )
    s = result["shares"]
    got = ", ".join(
        f"{k} {100 * v:.1f}% (owed {100 * s['owed'][k]:.1f}%)" for k, v in s["shares"].items()
    )
    print(f"shares of the first {s['first_starts']} starts: {got}")
    k = result["claim_cost"]
    print(
        f"claim of {k['batch']} at depth {k['backlog']}: fair p50 {k['fair_ms_p50']:.2f} ms "
        f"(p95 {k['fair_ms_p95']:.2f}), plain p50 {k['plain_ms_p50']:.2f} ms "
        f"(p95 {k['plain_ms_p95']:.2f}); fair / plain {k['fair_vs_plain_p50']:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
