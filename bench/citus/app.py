"""The application the Citus bench's worker processes run: the same no-op task on a plain Queue
and on a CitusQueue, its shard key the tenant it is given."""

from __future__ import annotations

from pgqueue import Queue
from pgqueue.citus import CitusQueue

plain = Queue()
cluster = CitusQueue(None)


@plain.task(name="bench.noop")
def noop(tenant: str) -> None:
    """A job of `tenant`, doing nothing: what is measured is the queue."""


@cluster.task(name="bench.noop", shard_key="{tenant}")
def sharded_noop(tenant: str) -> None:
    """The same job on the cluster, placed on its tenant's shard."""
