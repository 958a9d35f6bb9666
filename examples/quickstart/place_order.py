"""Place an order and enqueue its receipt in one transaction: both commit, or neither does.

PGQUEUE_DSN=... python place_order.py a@example.com   (prints the order's id and its job's id)
"""

from __future__ import annotations

import sys

import psycopg
from shop import DSN, queue, send_receipt


def place_order(conn: psycopg.Connection[tuple[int]], email: str) -> tuple[int, int]:
    conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, email text)")
    row = conn.execute("INSERT INTO orders (email) VALUES (%s) RETURNING id", [email]).fetchone()
    assert row is not None
    job_id = queue.enqueue(send_receipt.job(row[0], email), conn=conn)
    return row[0], job_id


if __name__ == "__main__":
    with psycopg.connect(DSN) as conn:  # commits when the block ends without an error
        order_id, job_id = place_order(conn, sys.argv[1])
    print(f"order {order_id}, job {job_id}")
