"""A Citus job's shard value (its shard_key, a template filled from its arguments, else its
concurrency key, else its queue) and a Citus worker's slots shared across shards by backlog.
No database: both are pure."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pgqueue import Queue
from pgqueue.citus import shard_of
from pgqueue.citus.slots import Known, fill, share
from pgqueue.errors import InvalidArgumentsError

queue = Queue(None)


@queue.task(name="orders.ship", shard_key="{tenant_id}")
def ship(tenant_id: str, order_id: int) -> None: ...


@queue.task(name="orders.audit", queue="audit")
def audit(order_id: int) -> None: ...


def test_the_shard_key_template_is_filled_from_the_arguments() -> None:
    assert shard_of(ship.job(tenant_id="acme", order_id=1)) == "acme"


def test_a_shard_key_given_at_enqueue_wins_over_the_tasks() -> None:
    assert shard_of(ship.with_options(shard_key="big").job(tenant_id="acme", order_id=1)) == "big"


def test_without_a_shard_key_the_concurrency_key_then_the_queue_place_the_job() -> None:
    assert shard_of(audit.with_options(concurrency_key="acme").job(order_id=1)) == "acme"
    assert shard_of(audit.job(order_id=1)) == "audit"


def test_a_template_its_arguments_cannot_fill_is_refused() -> None:
    job = ship.with_options(shard_key="{customer}").job(tenant_id="acme", order_id=1)
    with pytest.raises(InvalidArgumentsError, match="customer"):
        shard_of(job)


def test_slots_follow_the_backlog_and_every_shard_with_work_gets_one() -> None:
    got = share(10, {"big": 90, "small": 10, "idle": 0}, random.Random(1))
    assert got == {"big": 9, "small": 1}
    assert share(10, {"a": 2, "b": 3}, random.Random(1)) == {"a": 2, "b": 3}
    assert share(0, {"a": 2}, random.Random(1)) == {}


def test_with_fewer_slots_than_shards_each_shard_has_its_turn() -> None:
    rng = random.Random(7)
    backlog = {f"s{i}": 1 + 10 * (i == 0) for i in range(5)}
    turns: Counter[str] = Counter()
    for _ in range(500):
        got = share(2, backlog, rng)
        assert sum(got.values()) == 2
        turns.update(got)
    assert set(turns) == set(backlog)
    assert turns["s0"] == max(turns.values())


def test_on_the_nodes_slots_go_to_the_shards_in_turn_in_batches() -> None:
    backlog = {"1": 500, "2": 3, "3": 0, "4": 40}
    assert fill(10, backlog, 0) == {"1": 10}
    assert fill(10, backlog, 1) == {"2": 3, "4": 7}
    assert fill(10, backlog, 2) == {"4": 10}
    assert fill(10, backlog, 3) == {"1": 10}  # every shard with work was first once
    assert fill(100, backlog, 1) == {"2": 3, "4": 40, "1": 57}
    assert fill(0, backlog, 0) == {} and fill(5, {"1": 0}, 0) == {}


def test_a_backlog_read_is_kept_while_claims_come_back_full_for_one_interval() -> None:
    known = Known()
    assert not known.fresh(0.0)  # nothing read yet
    known.read({"a": 10, "b": 10, "c": 0}, now=0.0, keep=0.05)
    assert known.fresh(0.01)
    known.claimed("a", want=10, got=10)  # full: a still has work
    known.claimed("b", want=10, got=3)  # short: b is drained
    assert known.waiting == {"a": 10, "b": 0, "c": 0} and known.fresh(0.02)
    assert not known.fresh(0.05)  # the interval is over: read again
    known.claimed("a", want=10, got=0)
    assert not known.fresh(0.02)  # no known shard has work left: read again
