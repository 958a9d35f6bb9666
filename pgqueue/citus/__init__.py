"""pgqueue on a Citus cluster: jobs distributed by a shard column, colocated with the
application's rows, enqueued in the application's transaction and claimed shard by shard.

Owns: the layout `pgqueue migrate --citus` adds (layout.py), the queue that enqueues onto
shards and refuses what Citus cannot run (queue.py), and the worker that claims per shard
(worker.py). What works, what works within a shard and what is refused is listed in the docs
("Running on Citus"); everything refused raises CitusUnsupportedError before any SQL is sent.
"""

from pgqueue.citus.layout import migrate
from pgqueue.citus.queue import CitusQueue, shard_of
from pgqueue.citus.worker import CitusWorker
from pgqueue.errors import CitusUnsupportedError

__all__ = ["CitusQueue", "CitusUnsupportedError", "CitusWorker", "migrate", "shard_of"]
