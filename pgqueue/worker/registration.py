"""The worker's row in the workers table: its id, from its start to its stop.

Owns: the registration, a service of every worker (runtime/service.py), and what a worker says
of itself in its row. It refuses to start on a schema that is not migrated to this version.

Written on a connection whose commits wait for the WAL flush (the completer's): with the
claim connection's asynchronous commit, a server crash could lose the row and its id, which
a later worker would then get while this one still heartbeats under it.
"""

from __future__ import annotations

import os
import socket

from pgqueue.errors import DatabaseError
from pgqueue.models import WorkerSettings
from pgqueue.queries import migrations
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Health
from pgqueue.store.migrations import pending_async
from pgqueue.store.workers import WorkerIdentity, WorkersStore


class Registration:
    name = "registration"

    def __init__(
        self, link: Link, schema: str, identity: WorkerIdentity, *, session: bool = False
    ) -> None:
        """With `session` (not polling through PgBouncer), the row records the session it was
        written on, until the heartbeat's first beat records its own."""
        self.link = link
        self.store = WorkersStore(schema)
        self.identity = identity
        self.session = session
        self.worker_id = 0

    async def start(self) -> None:
        """Refuse to start on a schema that is not migrated to this version; then take a
        worker id."""
        schema = self.store.schema
        pending = await self.link.run(lambda conn: pending_async(conn, schema))
        option = "" if schema == "pgqueue" else f" --schema {schema}"
        if pending and len(pending) == len(migrations()):
            raise DatabaseError(
                f"schema {schema!r} has no pgqueue tables: run `pgqueue migrate{option}` first"
            )
        if pending:
            # This pgqueue's statements need them: a worker would fail at its first claim.
            names = ", ".join(f"{m.version:04d}_{m.name}" for m in pending)
            raise DatabaseError(
                f"schema {schema!r} lacks migrations {names} of this pgqueue version: run "
                f"`pgqueue migrate{option}` first"
            )
        self.worker_id = await self.link.run(
            lambda conn: self.store.register(conn, self.identity, session=self.session)
        )

    async def stop(self, deadline: float) -> None:
        await self.link.run(lambda conn: self.store.deregister(conn, self.worker_id))

    def health(self) -> Health:
        return Health(self.worker_id > 0, f"worker {self.worker_id}")


def identity(settings: WorkerSettings) -> WorkerIdentity:
    """What a worker with `settings` says of itself in its row."""
    return WorkerIdentity(
        name=settings.name or f"{socket.gethostname()}:{os.getpid()}",
        hostname=socket.gethostname(),
        pid=os.getpid(),
        queues=tuple(settings.queues),
        concurrency=settings.concurrency,
    )
