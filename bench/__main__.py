"""`python -m bench SUITE [OPTIONS]`: every benchmark behind one entry point.

`python -m bench` lists the suites; `python -m bench SUITE --help` gives a suite's options.
Each suite records the PostgreSQL version, its settings and the exact command beside its
figures; bench/README.md quotes them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SUITES = {
    "throughput": ("bench.throughput", "drain, enqueue and idle latency against peers and raw SQL"),
    "throughput-pairs": ("bench.throughput_pairs", "bulk enqueue against a raw COPY, in pairs"),
    "degradation": ("bench.degradation", "claims while a long transaction holds the horizon"),
    "chaos": ("bench.chaos", "kill -9, restarts and faults: nothing lost, nothing run twice"),
    "tenants": ("bench.tenants", "keyed claims against keyless ones, and fairness"),
    "tenants-overadmit": ("bench.tenants_overadmit", "the per-key limit under racing claims"),
    "dedupe": ("bench.dedupe", "what a dedupe key costs at enqueue"),
    "records": ("bench.records", "reading job records from a large history"),
    "history": ("bench.history", "pruning and reading a history of 1M jobs"),
    "rates": ("bench.rates", "what a rate limit costs a claim, and whether it holds its rate"),
    "workflows": ("bench.workflows", "waiting jobs against the claim, and a big chord's fan-in"),
    "workers": ("bench.many_workers", "32 worker processes idling and draining: what they cost"),
    "memory": ("bench.memory", "a worker's RSS, idle and draining a large backlog"),
    "enqueue-scale": ("bench.enqueue_scale", "enqueue from 1-64 connections against raw INSERT"),
    "partitions": ("bench.partitions", "retention: drop a day of history against DELETE"),
    "integrations": ("bench.integrations", "enqueue via Django and SQLAlchemy against psycopg"),
    "relay-throughput": ("bench.relay_throughput", "the relay against each broker's bare client"),
    "relay-degradation": ("bench.relay_degradation", "the relay's read under a held horizon"),
    "relay-chaos": ("bench.relay_chaos", "the relay killed and its broker restarted: lost, twice"),
    "dashboard": ("bench.dashboard", "dashboard pages and /metrics at 1M history; observed drain"),
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
    module = importlib.import_module(SUITES[name][0])
    code: int | None = module.main(rest)
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
