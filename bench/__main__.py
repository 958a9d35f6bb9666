"""`python -m bench SUITE [OPTIONS]`: every benchmark behind one entry point.

`python -m bench` lists the suites; `python -m bench SUITE --help` gives a suite's options.
Each suite records the PostgreSQL version, its settings and the exact command beside its
figures; bench/README.md quotes them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# Each suite's module in bench/, and what it answers.
SUITES = {
    "throughput": ("throughput.suite", "drain, enqueue and idle latency against peers and raw SQL"),
    "throughput-pairs": ("throughput.pairs", "bulk enqueue against a raw COPY, in pairs"),
    "degradation": ("degradation.suite", "claims while a long transaction holds the horizon"),
    "chaos": ("chaos.suite", "kill -9, restarts and faults: nothing lost, nothing run twice"),
    "tenants": ("tenants.suite", "keyed claims against keyless ones, and fairness"),
    "tenants-overadmit": ("tenants.overadmit", "the per-key limit under racing claims"),
    "fairness": ("fairness.suite", "quiet tenants beside a flood, shares by weight, claim cost"),
    "dedupe": ("dedupe.suite", "what a dedupe key costs at enqueue"),
    "records": ("records.suite", "reading job records from a large history"),
    "history": ("history.suite", "pruning and reading a history of 1M jobs"),
    "rates": ("rates.suite", "what a rate limit costs a claim, and whether it holds its rate"),
    "workflows": ("workflows.suite", "waiting jobs against the claim, and a big chord's fan-in"),
    "workers": ("workers.suite", "32 worker processes idling and draining: what they cost"),
    "processes": ("processes.suite", "pgqueue worker --processes N against another N"),
    "citus": ("citus.suite", "a Citus cluster against one server: drain, cost per job, W nodes"),
    "memory": ("memory.suite", "a worker's RSS, idle and draining a large backlog"),
    "enqueue-scale": ("enqueue_scale.suite", "enqueue from 1-64 connections against raw INSERT"),
    "partitions": ("partitions.suite", "retention: drop a day of history against DELETE"),
    "integrations": ("integrations.suite", "enqueue via Django and SQLAlchemy against psycopg"),
    "relay-throughput": ("relay.throughput", "the relay against each broker's bare client"),
    "relay-degradation": ("relay.degradation", "the relay's read under a held horizon"),
    "relay-chaos": ("relay.chaos", "the relay killed and its broker restarted: lost, twice"),
    "dashboard": ("dashboard.suite", "dashboard pages and /metrics at 1M history; observed drain"),
    "steady": ("steady.suite", "a worker keeping up at rising rates: latency, CPU per job"),
    "lifecycle": ("lifecycle.suite", "statements, rows, index entries and WAL per 1,000 jobs"),
    "durable": ("durable.suite", "checkpoints, steps against chains, parked jobs, wait() wake-up"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.splitlines()[0] + "\n\nsuites:")
        for name, (_, what) in SUITES.items():
            print(f"  {name:<18} {what}")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUITES:
        print(f"bench: no suite {name!r}; choose one of {', '.join(SUITES)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"bench.{SUITES[name][0]}")
    code: int | None = module.main(rest)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
