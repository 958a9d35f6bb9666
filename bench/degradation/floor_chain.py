"""Whether one claim from the floor leads a steady queue to the next.

    python -m bench.degradation.floor_chain [--dsn DSN] [--rounds N]

A real worker Claimer (pgqueue/worker/claimer.py) claims by hand on a fresh schema (dropped
at the end), its queue steady, as in a worker that keeps up with a stream. Its hint is
dropped once, as the safety net (hint_reset_interval) drops it. Then each round has what a
busy server always has: one enqueue in progress while the claim runs (it commits after), and
a later one already committed. It prints, per round, whether the claim started from the
floor, where the hint and the rewind stand, and where the watched transactions would send
the next claim. A chain (a claim from the floor every other round, for as long as an enqueue
is always in progress) shows that the claims from the floor are not the safety net's one in
hint_reset_interval but half of all claims; while a long transaction keeps the dead entries,
each of them walks every one (bench/degradation/walks.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.degradation.run import create_schema, drop_schema
from bench.server import database
from pgqueue.models import WorkerSettings
from pgqueue.queries import query
from pgqueue.runtime.link import Link
from pgqueue.worker.claimer import Claimer
from pgqueue.worker.observe import WorkerStats

QUEUE = "default"


def _enqueue(conn: psycopg.Connection[Any], schema: str) -> None:
    job = {"queue": QUEUE, "task": "noop", "args": {}, "priority": 0, "max_attempts": 3}
    params = {"jobs": json.dumps([job]), "now": None, "trace_context": None}
    conn.execute(query("job_insert", schema), params)


async def chain(dsn: str, schema: str, rounds: int) -> list[str]:
    lines = []
    link = Link(dsn, "claim")
    await link.open()
    try:
        with psycopg.connect(dsn, autocommit=True, application_name="bench:chain") as conn:
            row = conn.execute(
                sql.SQL(
                    "INSERT INTO {}.workers (name, hostname, pid, queues, concurrency)"
                    " VALUES ('chain', 'bench', 1, ARRAY[%s], 10) RETURNING id"
                ).format(sql.Identifier(schema)),
                [QUEUE],
            ).fetchone()
            claimer = Claimer(link, schema, WorkerSettings(), row[0] if row else 0, WorkerStats())
            claimer.hints.steady = {QUEUE}
            _enqueue(conn, schema)
            await claimer.claim_round(10)
            claimer.forget_hints()  # the safety net's reset
            for n in range(rounds):
                with psycopg.connect(dsn, application_name="bench:enqueue") as held:
                    _enqueue(held, schema)  # in progress during the claim
                    _enqueue(conn, schema)  # a later one, committed
                    before = claimer.stats.unhinted_claims
                    got, _ = await claimer.claim_round(10)
                    hint = claimer.hints[QUEUE]
                    floor = claimer.stats.unhinted_claims - before
                    watched = sorted({w.at for w in hint.watch.values()})
                    lines.append(
                        f"| {n} | {'yes' if floor else 'no'} | {len(got)} | {hint.after} "
                        f"| {hint.rewind} | {watched} |"
                    )
                    held.commit()
    finally:
        await link.close()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.degradation.floor_chain", description=__doc__
    )
    parser.add_argument("--dsn", help="PostgreSQL to use (default: an embedded server)")
    parser.add_argument("--rounds", type=int, default=8, help="claim rounds (8)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.rounds <= 0:
        parser.error(f"--rounds must be greater than 0, got {args.rounds}")
    schema = "bench_floor_chain"
    with database(options.dsn(args.dsn)) as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            create_schema(conn, schema)
        try:
            lines = asyncio.run(chain(server.dsn, schema, args.rounds))
        finally:
            drop_schema(server.dsn, schema)
    print("| round | from the floor | claimed | hint after | rewind | watched from |")
    print("|---:|---|---:|---|---|---|")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
