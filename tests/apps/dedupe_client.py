"""One enqueueing process of the dedupe race test (tests/integration/test_dedupe.py).

python -m tests.apps.dedupe_client DSN SCHEMA OUT GO KEYS ROUNDS WINDOW SEED

Waits for the file GO, then runs ROUNDS transactions, each enqueuing a shuffled sample of the
KEYS keys (some twice in one batch, beside jobs without a key) and committing, or every
fifth time rolling back. Writes one JSON line per committed job it was given to OUT:
{"key", "id", "created"}.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from pgqueue import Queue


def main() -> None:
    dsn, schema, out, go = sys.argv[1:5]
    keys, rounds, window, seed = (
        int(sys.argv[5]),
        int(sys.argv[6]),
        float(sys.argv[7]),
        int(sys.argv[8]),
    )
    rng = random.Random(seed)
    queue = Queue(schema=schema)
    task = queue.declare("noop")
    deadline = time.monotonic() + 60
    while not Path(go).exists():  # a start line for all processes at once
        if time.monotonic() > deadline:
            raise SystemExit("GO never appeared")
        time.sleep(0.005)
    lines = []
    with psycopg.connect(dsn) as conn:
        for n in range(rounds):
            sample = rng.sample(range(keys), k=max(1, keys // 2))
            sample += sample[:2]  # the same key twice in one batch
            options: dict[str, Any] = {"dedupe_window": window} if window else {}
            jobs = [task.with_options(dedupe_key=f"k{k}", **options).job() for k in sample]
            jobs.append(task.job())
            got = queue.enqueue_many(jobs, conn=conn)
            if n % 5 == 4:
                conn.rollback()
                continue
            conn.commit()
            for k, enqueued in zip(sample, got, strict=False):
                lines.append({"key": f"k{k}", "id": int(enqueued), "created": enqueued.created})
    Path(out).write_text("".join(json.dumps(line) + "\n" for line in lines))


if __name__ == "__main__":
    main()
