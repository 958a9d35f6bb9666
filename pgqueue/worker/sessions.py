"""What the worker's claim and completion connections are set up with, on every connect.

Owns: the session settings of those two connections (workers.sql: session_set_async_commit,
session_generic_plans, session_prefer_indexes). None is set when polling only: behind
PgBouncer's transaction pooling a session setting would stay on a server connection that other
clients' transactions use next.
"""

from __future__ import annotations

from pgqueue.store.plan import AsyncConn
from pgqueue.store.workers import WorkersStore
from pgqueue.values import tolerate


class Sessions:
    def __init__(self, schema: str, *, poll_only: bool) -> None:
        self.store = WorkersStore(schema)
        self.poll_only = poll_only

    async def claim(self, conn: AsyncConn) -> None:
        """The claim connection commits without waiting for its WAL flush, so a job starts
        sooner after a wake-up. Safe for lease claims and for everything else this connection
        writes (promotions, put-backs, rescues, the deregistration): a commit lost in a crash
        leaves the rows as they were, which the rescuer, the heartbeat and the next
        reconnect's orphan release already handle, and the completer's synchronous commit
        flushes the claim's WAL before any outcome is durable. Not for the worker's
        registration nor atomic lanes, whose transaction carries the handler's writes
        (test_worker.py pins which connections have it). Its prepared statements run on their
        generic plans: planning a claim afresh each time cost as much as the claim."""
        if not self.poll_only:
            await self.store.claim_session(conn)
            await self.store.generic_plans_session(conn)
        await self.planner(conn)
        tolerate(conn)  # a job whose row Python cannot read fails alone (values.py)

    async def planner(self, conn: AsyncConn) -> None:
        """The claim and completer connections plan for index access."""
        if not self.poll_only:
            await self.store.planner_session(conn)
