"""The wake-up channel's protocol, parsed here and nowhere else.

Owns: the meaning of a notification on the schema's wake-up channel (queries.channel). The
payloads are built by two SQL functions (sql/migrations/0008_wake.sql): `wake(queue, priority,
id)` sends 'queue priority id', the lowest (priority, id) a transaction made claimable in that
queue, and `wake_cancel(id)` sends '!cancel id', a request to stop a running job. A bare queue
name is also a wake-up, with no position. Pausing and resuming a queue (sql/queries/queues.sql)
send '!pause queue' and '!resume queue', so that workers leave a paused queue out of their
claims instead of every claim reading the pauses; setting or removing a queue's rate limit
sends '!rates queue', and a task's or a key's '!rates *' (every queue). Anything else is
ignored, never raised: a stray NOTIFY from another program must not stop a listener.
"""

from __future__ import annotations

from dataclasses import dataclass

Position = tuple[int, int]  # (priority, id) in the claim index
CANCEL_PREFIX = "!cancel "  # never the start of a queue name (models.QUEUE_NAME)
PAUSE_PREFIX = "!pause "
RESUME_PREFIX = "!resume "
RATES_PREFIX = "!rates "


@dataclass(frozen=True)
class Wake:
    """Jobs became claimable in `queue`, at `position` or after it; None: where is unknown."""

    queue: str
    position: Position | None


@dataclass(frozen=True)
class CancelRequest:
    """Someone asked that running job `job_id` stop."""

    job_id: int


@dataclass(frozen=True)
class PauseChange:
    """`queue` was paused (or resumed, `paused` False) by a transaction that committed."""

    queue: str
    paused: bool


@dataclass(frozen=True)
class RatesChange:
    """`queue`'s rate limit was set or removed by a transaction that committed ('*': a task's
    or a key's, which concerns every queue)."""

    queue: str


def parse(payload: str) -> Wake | CancelRequest | PauseChange | RatesChange | None:
    """What a notification on the wake-up channel says; None for a payload no pgqueue sends."""
    if payload.startswith(CANCEL_PREFIX):
        job_id = payload.removeprefix(CANCEL_PREFIX)
        return CancelRequest(int(job_id)) if job_id.isdigit() else None
    for prefix, paused in ((PAUSE_PREFIX, True), (RESUME_PREFIX, False)):
        if payload.startswith(prefix):
            queue = payload.removeprefix(prefix)
            return PauseChange(queue, paused) if queue and " " not in queue else None
    if payload.startswith(RATES_PREFIX):
        queue = payload.removeprefix(RATES_PREFIX)
        return RatesChange(queue) if queue and " " not in queue else None
    queue, _, rest = payload.partition(" ")
    if not queue or queue.startswith("!"):
        return None
    priority, _, job_id = rest.partition(" ")
    try:
        return Wake(queue, (int(priority), int(job_id)))
    except ValueError:
        return Wake(queue, None)
