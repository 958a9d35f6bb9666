"""A worker of a queue claimed fairly that heard only some wake-ups while busy, then asks for
all of them again (a widening; pgqueue/worker/interest.py). Its fair jobs at the hint's
priority or after are found from the hint however they became queued, so the fair claim
looks again only at more urgent priorities, and the plain hint is kept, its safety net's
next slice looked at: no claim walks from the floor, where a long transaction keeps a dead
entry for every fair job claimed."""

from __future__ import annotations

import asyncio

from psycopg import sql

from pgqueue import Queue
from tests.conftest import claimer_by_hand


def test_after_a_busy_spell_a_fair_worker_finds_an_unannounced_urgent_job_without_the_floor(
    dsn: str, schema: str, queue: Queue
) -> None:
    t = queue.task(name="t")(lambda: None)
    fair = t.with_options(fairness_key="a")

    async def scenario() -> None:
        async with claimer_by_hand(dsn, schema, steady=False) as (claimer, conn):
            for _ in range(3):
                queue.enqueue(fair.job(), conn=conn)
            assert len((await claimer.claim_round(10))[0]) == 3  # from the floor, the first
            assert (await claimer.claim_round(10))[0] == []
            hint = claimer._fair._hints["default"]
            plain = claimer.hints["default"]
            assert hint.after is not None and plain.after is not None
            # Enqueued while the worker skipped wake-ups: nobody announces it to the claimer.
            urgent = queue.enqueue(t.with_options(fairness_key="a", priority=-1).job(), conn=conn)
            assert (await claimer.claim_round(10))[0] == []  # control: the hint passes it
            at, plain_at = hint.after, plain.after
            unhinted = claimer.stats.unhinted_claims
            sweeps = claimer.sweeps

            claimer.unannounced("default")
            got = [j.id for j in (await claimer.claim_round(10))[0]]
            assert got == [urgent.id]
            assert claimer.stats.unhinted_claims == unhinted  # neither claim from the floor
            assert hint.after == at and not hint.urgent
            assert plain.after is not None and plain.after >= plain_at
            assert claimer.sweeps == sweeps + 1  # the plain safety net's slice, at once
            again = queue.enqueue(fair.job(), conn=conn)  # at the hint's priority: found
            assert [j.id for j in (await claimer.claim_round(10))[0]] == [again.id]

    asyncio.run(scenario())


def test_a_queue_without_fair_jobs_still_claims_from_the_floor_after_a_busy_spell(
    dsn: str, schema: str, queue: Queue
) -> None:
    """A plain job that came back behind the hint while the worker was busy is found by the
    next claim, from the floor, as before."""
    t = queue.task(name="t")(lambda: None)
    name = sql.Identifier(schema)

    async def scenario() -> None:
        async with claimer_by_hand(dsn, schema, steady=False) as (claimer, conn):
            first = queue.enqueue(t.job(), conn=conn)
            queue.enqueue(t.job(), conn=conn)
            assert len((await claimer.claim_round(10))[0]) == 2
            assert (await claimer.claim_round(10))[0] == []
            # The first job comes back (a rescue, say) behind the hint, unannounced.
            conn.execute(
                sql.SQL(
                    "UPDATE {}.jobs SET status = 'queued', worker_id = NULL WHERE id = %s"
                ).format(name),
                [first.id],
            )
            assert (await claimer.claim_round(10))[0] == []  # control
            unhinted = claimer.stats.unhinted_claims
            claimer.unannounced("default")
            assert [j.id for j in (await claimer.claim_round(10))[0]] == [first.id]
            assert claimer.stats.unhinted_claims == unhinted + 1

    asyncio.run(scenario())
