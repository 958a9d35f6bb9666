"""The application of the README's Get started: one task, on its own queue.

It works on the database PGQUEUE_DSN names, else DATABASE_URL, as the `pgqueue` command does,
and refuses to start when neither is set: an example that guessed a database would create its
tables and jobs somewhere you did not choose. From this folder:

    export PGQUEUE_DSN=postgresql://app@localhost/app    # a database you own
    pgqueue migrate
    python place_order.py a@example.com
    pgqueue worker shop:queue --queues all
"""

from __future__ import annotations

import os
import sys

from pgqueue import Queue

DSN = os.environ.get("PGQUEUE_DSN") or os.environ.get("DATABASE_URL")
if not DSN:
    sys.exit(
        "examples/quickstart: set PGQUEUE_DSN to a database you own, for example "
        "export PGQUEUE_DSN=postgresql://app@localhost/app"
    )

queue = Queue(DSN)


@queue.task(name="shop.send_receipt", queue="mail", max_attempts=5)
def send_receipt(order_id: int, email: str) -> str:
    return f"receipt for order {order_id} sent to {email}"
