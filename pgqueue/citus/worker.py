"""The worker of a Citus cluster: claims shard by shard on each shard's node, runs the jobs
with the worker's executor, and writes each shard's outcomes on that shard.

Owns: the round (read the backlog of every shard, promote due jobs, share the free slots by
backlog, claim each share naming its shard; on the nodes a backlog read serves the rounds of
a poll interval while their claims come back full, slots.Known) and the rescue of jobs whose
worker stopped heartbeating; the jobs in flight, their outcomes' writes and the put-back at
stop are inflight.py's, and where a shard's statements run is routes.py's. Every statement on
a job runs on the shard's node: on the node's own connection (`claim_on="nodes"`, the
default), a shard table at a time, every shard value in it together, or through the
coordinator, which runs a statement naming one shard value there as one task
(`"coordinator"`). On the nodes, only the shards' placements (every PLACEMENT_TTL) and the
search for stranded jobs go to the coordinator. Wake-ups are by polling (`poll_interval`):
an enqueue on Citus sends no NOTIFY.

Its registration and heartbeat are the plain worker's (worker/registration.py,
worker/heartbeat.py), on the coordinator's workers table; the rescue lease is the same
`lease_timeout`. Stopping: claiming stops, running jobs get `shutdown_grace`, the rest are
cancelled and put back without spending an attempt, then the worker row is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import time
from collections.abc import Awaitable
from functools import partial
from typing import Any, TypeVar

import psycopg

from pgqueue.citus.inflight import InFlight
from pgqueue.citus.routes import CLAIM_ON, Route, routes
from pgqueue.citus.slots import Known, fill, share
from pgqueue.errors import CitusUnsupportedError, ConfigurationError
from pgqueue.models import ALL_QUEUES, ClaimedJob, WorkerSettings
from pgqueue.queries import Tables
from pgqueue.registry import Registry
from pgqueue.runtime.link import Link
from pgqueue.runtime.service import Services
from pgqueue.store import citus as store
from pgqueue.store.plan import AsyncConn
from pgqueue.worker.declarations import sync_declarations
from pgqueue.worker.executor import Executor
from pgqueue.worker.heartbeat import Heartbeat
from pgqueue.worker.registration import Registration, identity

T = TypeVar("T")
log = logging.getLogger("pgqueue.citus")
STRAGGLER_THREADS = 64
STOP_GRACE = 60.0
RESCUE_BATCH = 1000


class CitusWorker:
    """Runs the jobs of a CitusQueue's tasks on a cluster, given the coordinator's DSN (the
    queue's by default). Settings as Worker's; those Citus does without are refused.
    `claim_on="coordinator"` sends every statement through the coordinator, for nodes this
    host cannot reach by the names the cluster knows them by."""

    def __init__(
        self,
        queue: Any,
        settings: WorkerSettings | None = None,
        *,
        dsn: str | None = None,
        schema: str | None = None,
        claim_on: str = "nodes",
        **overrides: Any,
    ) -> None:
        if claim_on not in CLAIM_ON:
            raise ConfigurationError(
                f"claim_on must be one of {', '.join(CLAIM_ON)}, got {claim_on!r}"
            )
        self.claim_on = claim_on
        if not all(hasattr(queue, name) for name in ("registry", "periodics", "settings")):
            raise ConfigurationError(
                f"CitusWorker takes the application's CitusQueue, got {type(queue).__name__}"
            )
        self.registry: Registry = queue.registry
        self.schema: str = schema or queue.settings.schema_name
        self.keep_history: bool = queue.settings.keep_history
        self.max_payload: int = queue.settings.max_payload_bytes
        found = dsn or getattr(queue, "dsn", None)
        if found is None:
            raise ConfigurationError("CitusWorker needs the coordinator's DSN: pass dsn=")
        self.dsn: str = found
        self.settings = settings or WorkerSettings(**overrides)
        if self.settings.queues == (ALL_QUEUES,):
            known = tuple(self.registry.queues())
            self.settings = self.settings.model_copy(update={"queues": known})
        _refuse_unsupported(queue)
        self.id = 0
        self.claimed = 0  # jobs claimed, this run
        self.jobs: InFlight | None = None  # this run's jobs
        self._rng = random.Random()
        self._turn = 0  # which shard with work a claim round on the nodes starts at
        self._known = Known()  # the last backlog read, while claims from it come back full
        self._stop_requested = False
        self._force = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._lost_claim = False  # a claim failed: put back what it may have taken first

    # -- public -----------------------------------------------------------------------------

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (or, with burst, until no shard has work)."""
        asyncio.run(self.run_async(handle_signals=True))

    async def run_async(self, *, handle_signals: bool = False) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self._serve()
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            self._loop = None

    def stop(self, *, force: bool = False) -> None:
        """Ask the worker to stop; safe from any thread."""
        loop = self._loop
        if loop is None:
            self._stop_requested = True
            return
        loop.call_soon_threadsafe(self._request_stop, force)

    # -- the run ----------------------------------------------------------------------------

    async def _serve(self) -> None:
        s = self.settings
        claims = Link(self.dsn, "claim", on_reconnect=self._release_orphans)
        finish = Link(self.dsn, "complete")
        services = Services()
        try:
            await services.start(claims)
            await services.start(finish)
            await self._require_layout(claims)
            await sync_declarations(finish, self.schema, self.registry)
            registration = Registration(finish, self.schema, identity(s))
            await services.start(registration)
            self.id = registration.worker_id
            await services.start(
                Heartbeat(self.dsn, self.schema, identity(s), self.id, s.heartbeat_interval)
            )
            executor = Executor(self.registry, s.concurrency + STRAGGLER_THREADS, self.max_payload)
            await services.start(executor)
            self.jobs = InFlight(executor, self.schema, self.keep_history, self._wake_up)
            shards, outcomes = routes(self.claim_on, self.dsn, self.schema, claims, finish)
            log.info(
                "citus worker %s started: queues=%s concurrency=%s schema=%s",
                self.id,
                ",".join(s.queues),
                s.concurrency,
                self.schema,
            )
            await self._rounds(claims, finish, shards, outcomes)
        finally:
            if self.id and self.jobs is not None:
                grace = 0.0 if self._force else s.shutdown_grace.total_seconds()
                await self.jobs.drain(outcomes, grace, self.id)
            await outcomes.close()
            await services.stop(STOP_GRACE)

    async def _release_orphans(self, conn: Any) -> None:
        """Jobs a claim took whose reply a broken connection lost: back to their queues."""
        held = self.jobs.held() if self.jobs is not None else []
        released = await store.release_orphans(conn, self.schema, self.id, held)
        self._lost_claim = False
        if released:
            log.warning("citus worker %s put back %d jobs of a lost claim", self.id, released)

    async def _require_layout(self, link: Link) -> None:
        async def check(conn: Any) -> bool:
            try:
                return await store.laid_out_async(conn, self.schema)
            except psycopg.errors.UndefinedTable:  # no pg_dist_partition: no citus here
                return False

        if not await link.run(check):
            raise CitusUnsupportedError(
                f"schema {self.schema!r} is not laid out for Citus on this database: run "
                "`pgqueue migrate --citus` on the coordinator and give its DSN"
            )

    async def _rounds(self, claims: Link, finish: Link, shards: Route, outcomes: Route) -> None:
        s = self.settings
        poll = s.poll_interval.total_seconds()
        next_round = 0.0
        next_rescue = 0.0  # first thing: jobs a dead worker left are claimable this round
        jobs = self.jobs
        assert jobs is not None
        while not self._stop_requested:
            now = time.monotonic()
            if now >= next_rescue:
                lease = s.lease_timeout.total_seconds()
                rescue = _rescue(finish, self.schema, lease, self.keep_history)
                await self._unless_a_node_fails("rescue", rescue)
                next_rescue = now + s.rescue_interval.total_seconds()
            if self._lost_claim:  # a claim failed: it may have committed all the same
                await self._unless_a_node_fails("put-back", claims.run(self._release_orphans))
            free = s.concurrency - len(jobs.running)
            if free > 0 and now >= next_round and not self._lost_claim:
                found, full = await self._unless_a_node_fails(
                    "claim", self._round(shards, free), (True, False)
                )
                if s.burst and not found and not jobs.running and not jobs.done:
                    return
                next_round = now if full else now + poll
            written = await self._unless_a_node_fails(
                "outcomes", jobs.write_outcomes(outcomes), False
            )
            if not written:
                next_round = max(next_round, now + poll)  # the outcomes wait for the node too
            await self._sleep(max(0.0, min(next_round, next_rescue) - time.monotonic()))

    async def _unless_a_node_fails(self, what: str, step: Awaitable[T], failed: Any = None) -> T:
        """Run `step`; if the cluster fails it (a node restarting: the coordinator's own
        connection is fine, so Link raises), log it and return `failed`, to try again later.
        Outcomes not written stay to be written (_write_outcomes)."""
        try:
            return await step
        except psycopg.Error as exc:
            log.warning("citus worker %s: %s failed, trying again: %s", self.id, what, exc)
            self._lost_claim = self._lost_claim or what == "claim"
            await asyncio.sleep(self.settings.poll_interval.total_seconds())
            result: T = failed
            return result

    async def _round(self, shards: Route, free: int) -> tuple[bool, bool]:
        """One claim round; whether any shard had work, and whether every share came back
        full (claim again at once)."""
        queues, in_flight, schema, known = self.settings.queues, self.jobs, self.schema, self._known
        assert in_flight is not None
        now = time.monotonic()
        if self.claim_on != "nodes" or not known.fresh(now):
            known.read(
                await self._backlog(shards, free), now, self.settings.poll_interval.total_seconds()
            )
        waiting = known.waiting
        found, full = any(n > 0 for n in waiting.values()), True
        if self.claim_on == "nodes":
            self._turn += 1
            shares = fill(free, waiting, self._turn)
        else:
            shares = share(free, waiting, self._rng)
        # A claim takes the queues in turn, so each round starts at one drawn at random.
        start = self._rng.randrange(len(queues)) if queues else 0
        in_turn = [*queues[start:], *queues[:start]]
        for shard, want in shares.items():
            claim = partial(
                _claim, schema=schema, shard=shard, queues=in_turn, limit=want, worker_id=self.id
            )
            jobs = await shards.run(shard, claim)
            known.claimed(shard, want, len(jobs))
            full = full and len(jobs) == want
            self.claimed += len(jobs)
            for job in jobs:
                in_flight.start(job, shard)
        # Shards with only jobs scheduled later have no share: no reason to claim at once.
        return found, full and bool(shares)

    async def _backlog(self, shards: Route, free: int) -> dict[str, int]:
        """Each shard's jobs waiting, its due ones promoted."""
        queues, limit = self.settings.queues, self.settings.promote_batch
        backlog = await shards.backlog(queues, free)
        for row in backlog:
            if row.due:
                promote = partial(
                    _promote, schema=self.schema, shard=row.shard, queues=queues, limit=limit
                )
                await shards.run(row.shard, promote)
        return {row.shard: row.queued + row.due for row in backlog}

    async def _sleep(self, timeout: float) -> None:
        assert self._wake is not None
        if (self.jobs is not None and self.jobs.done) or self._stop_requested:
            return
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _on_signal(self, sig: signal.Signals) -> None:
        log.warning("received %s: stopping%s", sig.name, " now" if self._stop_requested else "")
        self._request_stop(self._stop_requested)

    def _request_stop(self, force: bool) -> None:
        self._stop_requested = True
        self._force = self._force or force
        if self._wake is not None:
            self._wake.set()


async def _rescue(finish: Link, schema: str, lease: float, keep_history: bool) -> None:
    """Put back (or, attempts spent, fail) the running jobs of workers that stopped
    heartbeating for longer than the lease, each on its shard through the coordinator."""
    found = await finish.run(lambda c: store.stranded(c, schema, lease, RESCUE_BATCH))
    for job in found:
        if job.attempt < job.max_attempts:
            await finish.run(partial(store.rescue, schema=schema, job=job))
        else:
            fail = partial(
                store.finish,
                schema=schema,
                shard=job.shard,
                final=[store.lost_outcome(job)],
                retried=[],
                keep_history=keep_history,
            )
            await finish.run(fail)
    if found:
        log.warning("rescued %d jobs of workers that stopped heartbeating", len(found))


async def _promote(conn: AsyncConn, tables: Tables, **args: Any) -> int:
    return await store.promote(conn, tables=tables, **args)


async def _claim(conn: AsyncConn, tables: Tables, **args: Any) -> list[ClaimedJob]:
    return await store.claim(conn, tables=tables, **args)


def _refuse_unsupported(queue: Any) -> None:
    """A Citus worker runs neither atomic tasks nor recurring jobs: refuse at construction."""
    atomic = sorted(t.name for t in queue.registry if getattr(t, "atomic", False))
    if atomic:
        raise CitusUnsupportedError(
            f"atomic tasks are not available on Citus: {', '.join(atomic)} "
            '(see "Running on Citus" in the docs)'
        )
    if len(queue.periodics):
        raise CitusUnsupportedError(
            'recurring jobs are not available on Citus (see "Running on Citus" in the docs)'
        )
