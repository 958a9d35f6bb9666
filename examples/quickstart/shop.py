"""The application of the README's first steps: one task, on its own queue.

Run its worker with `pgqueue worker shop:queue --queues all` from this folder. The worker uses
the DSN given to Queue(...) below unless --dsn, PGQUEUE_DSN or DATABASE_URL names another.
"""

from __future__ import annotations

import os

from pgqueue import Queue

queue = Queue(os.environ.get("SHOP_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))


@queue.task(name="shop.send_receipt", queue="mail", max_attempts=5)
def send_receipt(order_id: int, email: str) -> str:
    return f"receipt for order {order_id} sent to {email}"
