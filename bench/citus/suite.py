"""pgqueue on a local Citus cluster against one plain server: the drain, and what a job costs
each server.

    python -m bench citus [--jobs 20000] [--tenants 32] [--concurrency 10] [--rounds 2]
                          [--rate 100] [--seconds 20] [--out DIR] [--short]

It starts a Citus cluster (a coordinator and two nodes, bench/citus/cluster.py) and one plain
server of the same PostgreSQL and settings, all on this host. Each round, on fresh schemas,
for each system, in an order that alternates between rounds:

- `single`: the plain server and `pgqueue worker`;
- `coordinator`: the cluster and `pgqueue worker --citus-claims coordinator`;
- `nodes`: the cluster and `pgqueue worker` (claims and outcomes on each shard's node).

It enqueues --jobs no-op jobs over --tenants shard keys, one job per transaction from
PRODUCERS connections, then drains them with one `pgqueue worker --burst`; then, in the
steady state (bench/citus/steady.py), a running worker keeps up with --rate jobs a second
for --seconds, and each job's wait from its enqueue to its start is measured. For each phase
it reads each server's CPU (its processes' user and system time, from /proc), WAL and
statements (pg_stat_statements), and the worker's CPU, per job. It checks the plans: through
the coordinator a claim is one task; on a node, a plain statement on the shard's table.

From the nodes' per-job costs it states a model of W nodes (`model`). Each figure is the
median of the rounds. Writes results.json (bench/report.py) and prints tables.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import options
from bench.citus import app, cluster, floor, steady
from bench.citus.meters import Meter, per_job, readings
from bench.citus.produce import PRODUCERS, in_threads, queue_for
from bench.report import Run, guarded
from bench.server import Server, database
from pgqueue.citus.routes import Nodes
from pgqueue.runtime.link import Link
from pgqueue.store import citus as store

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("single", "coordinator", "nodes")
# pg_stat_statements counts what each server runs, Citus's own statements on the nodes too.
STATS = {"shared_preload_libraries": "'citus,pg_stat_statements'"}
PLAIN_STATS = {"shared_preload_libraries": "'pg_stat_statements'"}
# Model: the cores of each node and of the coordinator (an assumption, stated with it).
CORES = 8
NODE_COUNTS = (2, 4, 8, 16, 32)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "citus", __doc__.split("\n\n")[0], short="the CI run: 600 jobs, 8 tenants, 1 round"
    )
    parser.add_argument("--jobs", type=int, help="jobs per system and round (default 20000)")
    parser.add_argument("--tenants", type=int, help="shard keys the jobs spread over (32)")
    parser.add_argument("--concurrency", type=int, default=10, help="the worker's (10)")
    parser.add_argument("--rounds", type=int, help="rounds (default 2)")
    parser.add_argument("--rate", type=float, help="steady state: jobs/s offered (default 100)")
    parser.add_argument("--seconds", type=float, help="steady state: seconds (default 20)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"jobs": 600, "tenants": 8, "rounds": 1, "rate": 50.0, "seconds": 2.0},
        full={"jobs": 20000, "tenants": 32, "rounds": 2, "rate": 100.0, "seconds": 20.0},
    )
    options.positive(
        parser,
        {
            "--jobs": args.jobs,
            "--tenants": args.tenants,
            "--concurrency": args.concurrency,
            "--rounds": args.rounds,
            "--rate": args.rate,
            "--seconds": args.seconds,
        },
    )
    if args.dsn:
        parser.error("--dsn: this suite starts its own servers (a Citus cluster and a plain one)")
    return args


# -- one system, one round ---------------------------------------------------------------------


@contextmanager
def schema_on(system: str, dsn: str) -> Iterator[str]:
    name = f"bench_citus_{uuid.uuid4().hex[:8]}"
    made = queue_for(system, dsn, name)
    try:
        made.migrate()
        yield name
    finally:
        made.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def enqueue(system: str, dsn: str, schema: str, jobs: int, tenants: int) -> float:
    """--jobs jobs, one per transaction, from PRODUCERS threads; the seconds it took."""
    queue = queue_for(system, dsn, schema)
    task = app.noop if system == "single" else app.sharded_noop

    def produce(start: int) -> None:
        for n in range(start, jobs, PRODUCERS):
            queue.enqueue(task.job(tenant=f"tenant-{n % tenants}"))

    began = time.monotonic()
    try:
        in_threads(produce)
    finally:
        queue.close()
    return time.monotonic() - began


def drain(system: str, dsn: str, schema: str, concurrency: int, log: Path) -> dict[str, float]:
    """One `pgqueue worker --burst`: its wall time, its CPU, and the rate once it started."""
    target = "bench.citus.app:plain" if system == "single" else "bench.citus.app:cluster"
    command = [sys.executable, "-m", "pgqueue", "worker", target, "--dsn", dsn]
    command += ["--schema", schema, "--burst", "--concurrency", str(concurrency)]
    command += ["--poll-interval", "0.05", "--log-level", "warning"]
    if system != "single":
        command += ["--citus-claims", system]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - began
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"the {system} worker exited with {done.returncode}:\n{tail}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*), count(DISTINCT id),"
                " extract(epoch FROM max(finished_at) - min(started_at))::float8"
                " FROM {}.job_history WHERE status = 'succeeded' AND attempt = 1"
            ).format(sql.Identifier(schema))
        ).fetchone()
    assert row is not None
    return {"wall_s": wall, "worker_cpu_s": cpu, "ran": row[0], "ran_once": row[1], "span": row[2]}


def one(
    system: str, servers: dict[str, list[Meter]], args: argparse.Namespace, log: Path
) -> dict[str, Any]:
    meters = servers["single" if system == "single" else "cluster"]
    dsn = meters[0].dsn
    with schema_on(system, dsn) as schema:
        before = readings(meters)
        seconds = enqueue(system, dsn, schema, args.jobs, args.tenants)
        queued = readings(meters)
        ran = drain(system, dsn, schema, args.concurrency, log)
        drained = readings(meters)
        kept_up = steady.run(system, meters, schema, args, log.with_suffix(".steady.log"))
    if ran["ran_once"] != args.jobs:
        raise RuntimeError(f"{system}: {ran['ran_once']} of {args.jobs} jobs ran once")
    return {
        "enqueue_jobs_per_second": round(args.jobs / seconds, 1),
        "drain_jobs_per_second": round(args.jobs / ran["span"], 1),
        "drain_wall_s": round(ran["wall_s"], 2),
        "worker_cpu_ms_per_job": round(ran["worker_cpu_s"] * 1000 / args.jobs, 4),
        "enqueue": per_job(before, queued, args.jobs),
        "drain": per_job(queued, drained, args.jobs),
        "steady": kept_up,
    }


# -- plans -----------------------------------------------------------------------------------


def plans(coordinator: str) -> dict[str, Any]:
    """The claim's plan through the coordinator (one task), and on the shard's node (no
    Citus node in it, the shard's own table)."""
    with schema_on("coordinator", coordinator) as schema:
        params = {"shard": "tenant-0", "queues": ["default"], "limit": 10, "worker_id": 1}
        with psycopg.connect(coordinator) as conn:
            explain = sql.SQL("EXPLAIN ") + store.claim_statement(schema)
            routed = "\n".join(r[0] for r in conn.execute(explain, params).fetchall())
            row = conn.execute(
                "SELECT get_shard_id_for_distribution_column(%s::regclass, 'tenant-0')",
                [f"{schema}.jobs"],
            ).fetchone()
            assert row is not None
            key = str(row[0])  # the shard's key on the nodes: its jobs shard's id
            conn.rollback()

        async def on_node() -> str:
            link = Link(coordinator, "bench")
            nodes = Nodes(coordinator, schema, link)

            async def explain(conn: Any, tables: Any) -> str:
                cur = await conn.execute(
                    sql.SQL("EXPLAIN ") + store.claim_statement(schema, tables), params
                )
                return "\n".join(r[0] for r in await cur.fetchall())

            try:
                return await nodes.run(key, explain)
            finally:
                await nodes.close()
                await link.close()

        local = asyncio.run(on_node())
    return {
        "through_coordinator_task_count_1": "Task Count: 1" in routed,
        "on_node_without_citus": "Citus" not in local and "jobs_" in local,
        "through_coordinator": routed,
        "on_node": local,
    }


# -- the model -------------------------------------------------------------------------------


def model(
    nodes: dict[str, Any], single: dict[str, Any], node_count: int, bare: dict[str, Any]
) -> dict[str, Any]:
    """Jobs/s a cluster of W nodes sustains if each node's CPU is what bounds it, from the
    measured cost of a job (enqueue and drain) on the nodes and on the coordinator; beside
    it, the enqueue's and the drain's ratios apart, and Citus's own ratio for a bare row
    written through the coordinator (floor.py), which no enqueue that way can go under."""
    node_ms = sum(
        phase[role]["cpu_ms"]
        for phase in (nodes["enqueue"], nodes["drain"])
        for role in phase
        if role.startswith("node")
    )
    coordinator_ms = sum(nodes[phase]["coordinator"]["cpu_ms"] for phase in ("enqueue", "drain"))
    single_ms = sum(single[phase]["single"]["cpu_ms"] for phase in ("enqueue", "drain"))
    per_core_node = 1000 / node_ms
    per_core_coordinator = 1000 / coordinator_ms
    rows = []
    for w in NODE_COUNTS:
        bound_nodes = w * CORES * per_core_node
        bound_coordinator = CORES * per_core_coordinator
        rows.append(
            {
                "nodes": w,
                "node_bound_jobs_per_second": round(bound_nodes),
                "coordinator_bound_jobs_per_second": round(bound_coordinator),
                "jobs_per_second": round(min(bound_nodes, bound_coordinator)),
                "worker_cores": round(
                    min(bound_nodes, bound_coordinator) * nodes["worker_cpu_ms_per_job"] / 1000, 1
                ),
                # A transaction whose jobs have k shard keys, spread evenly over w nodes,
                # reaches one node with probability w^-(k-1); else it commits by 2PC.
                "two_phase_share_k2": round(1 - 1 / w, 3),
            }
        )
    return {
        "assumptions": (
            f"{CORES} cores a node and {CORES} on the coordinator; each node's CPU bounds it "
            "(not its disk or network); shards spread evenly; enough worker processes "
            "(worker_cores); every enqueue through the coordinator, one job per transaction "
            "on one node (no two-phase commit: two_phase_share_k2 is for transactions "
            "with two shard keys)"
        ),
        "measured_on": f"{node_count} nodes and a coordinator sharing one host",
        "node_cpu_ms_per_job": round(node_ms, 4),
        "coordinator_cpu_ms_per_job": round(coordinator_ms, 4),
        "single_cpu_ms_per_job": round(single_ms, 4),
        "node_vs_single": round(node_ms / single_ms, 2),
        "enqueue_node_vs_single": _ratio(nodes, single, "enqueue"),
        "drain_node_vs_single": _ratio(nodes, single, "drain"),
        "bare_row_node_vs_single": round(
            _nodes_ms(bare["cluster"]) / bare["single"]["single"]["cpu_ms"], 2
        ),
        "rows": rows,
    }


def _nodes_ms(costs: dict[str, Any]) -> float:
    return float(sum(cost["cpu_ms"] for role, cost in costs.items() if role.startswith("node")))


def _ratio(nodes: dict[str, Any], single: dict[str, Any], phase: str) -> float:
    return round(_nodes_ms(nodes[phase]) / float(single[phase]["single"]["cpu_ms"]), 2)


# -- the run ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    return guarded("citus", lambda: bench(Run("citus", argv, args.out, args.short), args))


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, nested dicts alike."""
    first = rounds[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = _median([r[key] for r in rounds])
        else:
            out[key] = round(statistics.median(r[key] for r in rounds), 4)
    return out


def bench(run: Run, args: argparse.Namespace) -> int:
    why = cluster.installed()
    if why:
        raise RuntimeError(f"Citus cannot run here: {why}")
    with (
        cluster.running(nodes=2, settings=STATS) as c,
        cluster.single(PLAIN_STATS) as plain,
        database(plain.coordinator) as server,
    ):
        for dsn in [c.coordinator, plain.coordinator]:  # Citus creates it on the nodes too
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        servers = {
            "single": [Meter("single", plain.coordinator, plain.data(0))],
            "cluster": [
                Meter("coordinator", c.coordinator, c.data(0)),
                *(Meter(f"node{i}", dsn, c.data(i)) for i, dsn in enumerate(c.nodes, start=1)),
            ],
        }
        out = run.folder(server)
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        per: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
        for r in range(args.rounds):
            order = SYSTEMS if r % 2 == 0 else tuple(reversed(SYSTEMS))
            for system in order:
                log = logs / f"round{r}-{system}.log"
                per[system].append(one(system, servers, args, log))
                print(f"bench: round {r + 1} {system} done", file=sys.stderr)
        medians = {s: _median(rounds) for s, rounds in per.items()}
        # The same number of bare rows as jobs: what Citus costs a routed write on its own.
        bare = floor.run(servers["single"], servers["cluster"], args.jobs, args.tenants)
        figures = {
            "jobs": args.jobs,
            "tenants": args.tenants,
            "concurrency": args.concurrency,
            "producers": PRODUCERS,
            "rounds": args.rounds,
            "steady_rate": args.rate,
            "steady_seconds": args.seconds,
            "nodes": len(c.nodes),
            "shard_count": cluster.SHARD_COUNT,
            "systems": medians,
            "each_round": per,
            "plans": plans(c.coordinator),
            "floor": bare,
            "model": model(medians["nodes"], medians["single"], len(c.nodes), bare),
        }
        run.write(out, "results.json", server, figures)
    _print(figures, server)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


def _print(figures: dict[str, Any], server: Server) -> None:
    systems = figures["systems"]
    print(
        f"PostgreSQL {server.version}, Citus: a coordinator and {figures['nodes']} nodes on this "
        f"host; {figures['jobs']:,} jobs over {figures['tenants']} shard keys; --concurrency "
        f"{figures['concurrency']}; medians of {figures['rounds']} round(s)\n"
    )
    print("| system | enqueue jobs/s | drain jobs/s | worker CPU ms/job |")
    print("|---|---:|---:|---:|")
    for name, got in systems.items():
        print(
            f"| {name} | {got['enqueue_jobs_per_second']:,.0f} | "
            f"{got['drain_jobs_per_second']:,.0f} | {got['worker_cpu_ms_per_job']} |"
        )
    print("\n| system | phase | server | CPU ms/job | WAL bytes/job | statements/job |")
    print("|---|---|---|---:|---:|---:|")
    for name, got in systems.items():
        for phase in ("enqueue", "drain"):
            for role, cost in got[phase].items():
                print(
                    f"| {name} | {phase} | {role} | {cost['cpu_ms']} | {cost['wal_bytes']} | "
                    f"{cost['statements']} |"
                )
    print(
        f"\nsteady state: {figures['steady_rate']:,.0f} jobs/s offered for "
        f"{figures['steady_seconds']:.0f} s, one job per transaction from {figures['producers']} "
        f"connections; each worker polls every {steady.POLL} s\n"
    )
    print("| system | wait p50 ms | wait p99 ms | last job run after, s | server | CPU ms/job |")
    print("|---|---:|---:|---:|---|---:|")
    for name, got in systems.items():
        kept = got["steady"]
        for role, cost in kept["servers"].items():
            print(
                f"| {name} | {kept['wait_p50_ms']} | {kept['wait_p99_ms']} | "
                f"{kept['last_run_after_s']} | {role} | {cost['cpu_ms']} |"
            )
    m = figures["model"]
    p = figures["plans"]
    print(
        f"\nplans: through the coordinator, Task Count 1: {p['through_coordinator_task_count_1']};"
        f" on the node, no Citus node: {p['on_node_without_citus']}"
    )
    print(
        f"\nmodel ({m['assumptions']}): a job costs the nodes {m['node_cpu_ms_per_job']} ms, "
        f"the coordinator {m['coordinator_cpu_ms_per_job']} ms, one plain server "
        f"{m['single_cpu_ms_per_job']} ms ({m['node_vs_single']}x: enqueue "
        f"{m['enqueue_node_vs_single']}x, drain {m['drain_node_vs_single']}x); a bare row "
        f"through the coordinator costs the nodes {m['bare_row_node_vs_single']}x a plain "
        "server's\n"
    )
    print("| nodes | jobs/s (node-bound) | coordinator-bound | worker cores | 2PC share, 2 keys |")
    print("|---:|---:|---:|---:|---:|")
    for row in m["rows"]:
        print(
            f"| {row['nodes']} | {row['node_bound_jobs_per_second']:,} | "
            f"{row['coordinator_bound_jobs_per_second']:,} | {row['worker_cores']} | "
            f"{row['two_phase_share_k2']} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
