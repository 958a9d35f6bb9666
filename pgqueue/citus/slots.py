"""How a Citus worker shares its free slots across shards, none starving.

No I/O. Across shard values (`share`, claims through the coordinator): each value with work
gets slots in proportion to its backlog, at most its backlog, and at least one while slots
last; with fewer slots than values, which get one is drawn at random, weighted by backlog,
so every value with work has its turn. Across shard tables (`fill`, claims on the nodes,
where a table holds many values): the shards with work in turn, each taking what it has up to
the slots left, so that claims come in batches; the first shard moves on by one each round,
so every shard with work is first within as many rounds as there are shards.
"""

from __future__ import annotations

import random
from collections.abc import Mapping


def share(free: int, backlog: Mapping[str, int], rng: random.Random) -> dict[str, int]:
    """Split `free` slots across the shards of `backlog` (jobs waiting per shard value)."""
    waiting = {shard: n for shard, n in backlog.items() if n > 0}
    if free <= 0 or not waiting:
        return {}
    if free < len(waiting):
        return dict.fromkeys(_draw(free, waiting, rng), 1)
    total = sum(waiting.values())
    shares = {shard: max(1, min(n, free * n // total)) for shard, n in waiting.items()}
    left = free - sum(shares.values())
    # What rounding left over goes to the shards with the most still waiting.
    while left > 0:
        more = [s for s in waiting if shares[s] < waiting[s]]
        if not more:
            break
        for shard in sorted(more, key=lambda s: waiting[s] - shares[s], reverse=True)[:left]:
            shares[shard] += 1
            left -= 1
    while left < 0:  # the floor of one each went over: take back from the largest
        largest = max(shares, key=lambda s: shares[s])
        shares[largest] -= 1
        left += 1
    return {shard: n for shard, n in shares.items() if n > 0}


def _draw(k: int, weights: Mapping[str, int], rng: random.Random) -> list[str]:
    """`k` distinct shards, each drawn with probability in proportion to its weight."""
    # Efraimidis-Spirakis: the k largest of u ** (1 / w).
    keyed = sorted(weights, key=lambda s: rng.random() ** (1.0 / weights[s]), reverse=True)
    return keyed[:k]


def fill(free: int, backlog: Mapping[str, int], turn: int) -> dict[str, int]:
    """Split `free` slots across the shards of `backlog`, starting at the `turn`-th of them
    (in key order, wrapping), each taking up to its backlog."""
    waiting = sorted(shard for shard, n in backlog.items() if n > 0)
    shares: dict[str, int] = {}
    left = free
    for i in range(len(waiting)):
        if left <= 0:
            break
        shard = waiting[(turn + i) % len(waiting)]
        shares[shard] = min(backlog[shard], left)
        left -= shares[shard]
    return shares


class Known:
    """The shards a worker on the nodes knows to have work, between reads of their backlog.

    While its claims come back full, a worker claims again at once; reading every node's
    backlog before each of those claims would cost the nodes as much as the claims. So the
    backlog read at a round is kept for one poll interval: a shard stays known while its
    claims return what they asked, and is dropped at its first short one. The next read comes
    when the interval is over or no known shard is left, so a shard that gets work meanwhile
    waits at most the poll interval, as it would for an idle worker's poll.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}
        self._until = float("-inf")

    def fresh(self, now: float) -> bool:
        return now < self._until and any(n > 0 for n in self.waiting.values())

    def read(self, waiting: dict[str, int], now: float, keep: float) -> None:
        self.waiting = dict(waiting)
        self._until = now + keep

    def claimed(self, shard: str, want: int, got: int) -> None:
        if got < want:
            self.waiting[shard] = 0
