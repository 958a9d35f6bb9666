"""Orders distributed by tenant on a Citus cluster, each shipped by a job enqueued with it.

    CITUS_DSN=postgresql://postgres@coordinator:5432/postgres python shop.py

needs a Citus coordinator with its nodes added. It lays pgqueue's tables out for the cluster
(as `pgqueue migrate --citus` does), creates an orders table distributed by tenant_id and
colocated with the jobs, and places orders: each with its shipping job in one transaction,
which commits on the tenant's node alone; one is rolled back with its job. Then two worker
processes (`pgqueue worker shop:queue --burst`) ship what committed, and it prints each
tenant's shipped orders.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import sql

from pgqueue.citus import CitusQueue

HERE = Path(__file__).resolve().parent
DSN = os.environ.get("CITUS_DSN", "")
SCHEMA = os.environ.get("SHOP_SCHEMA", "shop")
queue = CitusQueue(DSN or None, schema=SCHEMA)
ORDERS = sql.SQL("{}.orders").format(sql.Identifier(SCHEMA))


@queue.task(name="shop.ship", shard_key="{tenant_id}")
def ship(tenant_id: str, order_id: int) -> None:
    # Names the tenant: one statement on the tenant's node, where this job ran from.
    with psycopg.connect(DSN) as conn:
        conn.execute(
            sql.SQL("UPDATE {} SET shipped = true WHERE tenant_id = %s AND id = %s").format(ORDERS),
            [tenant_id, order_id],
        )


def set_up() -> None:
    queue.migrate()
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (tenant_id text, id bigserial, item text, "
                "shipped boolean NOT NULL DEFAULT false, PRIMARY KEY (tenant_id, id))"
            ).format(ORDERS)
        )
        distributed = conn.execute(
            "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = %s::regclass",
            [f"{SCHEMA}.orders"],
        ).fetchone()
        if distributed == (0,):
            conn.execute(
                "SELECT create_distributed_table(%s, 'tenant_id', colocate_with => %s)",
                [f"{SCHEMA}.orders", f"{SCHEMA}.jobs"],
            )


def place_order(tenant_id: str, item: str, *, pay: bool = True) -> None:
    """The order and its shipping job commit together, or neither does."""
    with psycopg.connect(DSN) as conn:
        row = conn.execute(
            sql.SQL("INSERT INTO {} (tenant_id, item) VALUES (%s, %s) RETURNING id").format(ORDERS),
            [tenant_id, item],
        ).fetchone()
        assert row is not None
        queue.enqueue(ship.job(tenant_id=tenant_id, order_id=row[0]), conn=conn)
        if not pay:
            conn.rollback()


def run_workers() -> None:
    command = [sys.executable, "-m", "pgqueue", "worker", "shop:queue", "--burst"]
    command += ["--dsn", DSN, "--poll-interval", "0.2"]
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    workers = [subprocess.Popen(command, cwd=HERE, env=env) for _ in range(2)]
    for worker in workers:
        if worker.wait(timeout=120) != 0:
            raise SystemExit("a worker failed")


def main() -> None:
    if not DSN:
        raise SystemExit("set CITUS_DSN to the Citus coordinator's DSN")
    set_up()
    for tenant, item in [("acme", "anvil"), ("acme", "rocket"), ("globex", "lamp")]:
        place_order(tenant, item)
    place_order("initech", "stapler", pay=False)  # rolled back, and its job with it
    run_workers()
    with psycopg.connect(DSN) as conn:
        shipped = conn.execute(
            sql.SQL(
                "SELECT tenant_id, string_agg(item, ', ' ORDER BY item) FROM {} "
                "WHERE shipped GROUP BY tenant_id ORDER BY tenant_id"
            ).format(ORDERS)
        ).fetchall()
    for tenant, items in shipped:
        print(f"{tenant}: shipped {items}")


if __name__ == "__main__":
    main()
