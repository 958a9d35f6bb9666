"""The relay's read while a long transaction holds the horizon: from its hint, against from
the start, as the messages it deleted pile up behind it as dead rows VACUUM cannot remove.

    python -m bench relay-degradation [--dsn DSN] [--rounds 10] [--per-round 5000] [--out DIR]
                                      [--short]

A REPEATABLE READ transaction takes its snapshot first and stays open. Then each round
stages --per-round messages and times the relay's read of the first batch (500) of them
(EXPLAIN ANALYZE, BUFFERS) two ways: after its hint, the last message it handled, which is
how the relay reads; and from the start, which is how it reads once every hint reset and how
an outbox without a hint reads every time. Then a Relay (this process, a sink that accepts
everything) publishes and deletes the round's messages, which stay behind as dead rows.
Writes results.json to its results folder (bench/report.py) and prints a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_database
from pgqueue import Message, Queue
from pgqueue.queries import query
from pgqueue.relay import Relay
from pgqueue.sinks import CallableSink, Outgoing


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "relay-degradation", __doc__.split("\n\n")[0], short="the CI run: 3 rounds of 1,000"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 10)")
    parser.add_argument("--per-round", type=int, help="messages per round (default 5000)")
    args = parser.parse_args(argv)
    options.sized(
        args, short={"rounds": 3, "per_round": 1000}, full={"rounds": 10, "per_round": 5000}
    )
    options.positive(parser, {"--rounds": args.rounds, "--per-round": args.per_round})
    return args


def timed_read(conn: psycopg.Connection[Any], schema: str, after: int) -> dict[str, float]:
    statement = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + query("outbox_read", schema)
    params = {"after": after, "open": [], "later": None, "limit": 500}  # no transaction open
    plan = "\n".join(r[0] for r in conn.execute(statement, params))
    top = next(line for line in plan.splitlines() if "Buffers:" in line)  # the whole read's
    buffers = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
    ms = float(re.search(r"Execution Time: ([\d.]+) ms", plan).group(1))  # type: ignore[union-attr]
    return {"ms": ms, "buffers": buffers}


def accept(message: Outgoing) -> None:
    """A broker that takes everything at once."""


async def relay_round(dsn: str, schema: str, count: int) -> int:
    relay = Relay({"ok": CallableSink(accept)}, dsn=dsn, schema=schema, batch_size=500)
    task = asyncio.create_task(relay.run())
    while relay.stats.published < count and not task.done():
        await asyncio.sleep(0.01)
    relay.stop()
    await task
    return relay.stats.published


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    run = Run("relay-degradation", argv, args.out, args.short)
    return guarded("relay-degradation", lambda: bench(run, args))


def bench(run: Run, args: argparse.Namespace) -> int:
    rounds: list[dict[str, Any]] = []
    with (
        database(options.dsn(args.dsn)) as server,
        scratch_database(server.dsn, "bench_relay_degradation") as dsn,
    ):
        out = run.folder(server)
        queue = Queue(schema="pgqueue")
        with psycopg.connect(dsn, autocommit=True) as conn:
            queue.migrate(conn=conn)
        holder = psycopg.connect(dsn)
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgqueue.outbox")  # the snapshot, held
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                hint = 0
                for r in range(args.rounds):
                    with conn.transaction():
                        ids = queue.stage_many(
                            [Message(destination="ok:x", message={"n": n}, key=f"k{n % 50}")
                             for n in range(args.per_round)],
                            conn=conn,
                        )  # fmt: skip
                    dead = r * args.per_round
                    row = {
                        "round": r + 1,
                        "dead_rows_behind": dead,
                        "from_hint": timed_read(conn, "pgqueue", hint),
                        "from_start": timed_read(conn, "pgqueue", 0),
                    }
                    published = asyncio.run(relay_round(dsn, "pgqueue", args.per_round))
                    row["published"] = published
                    rounds.append(row)
                    hint = ids[-1]
        finally:
            holder.close()
        last = rounds[-1]
        figures = {
            "rounds": rounds,
            "per_round": args.per_round,
            "last_round_ratio_ms": round(
                last["from_start"]["ms"] / max(last["from_hint"]["ms"], 1e-3), 1
            ),
        }
        run.write(out, "results.json", server, figures)
    print(f"PostgreSQL {server.version}: a snapshot held; {args.per_round:,} messages a round")
    print("round  dead behind  from hint (ms, buffers)  from start (ms, buffers)")
    for row in rounds:
        h, s = row["from_hint"], row["from_start"]
        print(
            f"{row['round']:>5}  {row['dead_rows_behind']:>11,}  {h['ms']:>9.2f} {h['buffers']:>9,}"
            f"      {s['ms']:>9.2f} {s['buffers']:>9,}"
        )
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
