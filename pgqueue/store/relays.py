"""What relays say of themselves (the relays table), for `pgqueue status`. Runs
sql/queries/relays.sql."""

from __future__ import annotations

from datetime import datetime

from pgqueue.models import RelayState
from pgqueue.queries import query
from pgqueue.store.plan import AsyncConn, Plan, execute


async def report(conn: AsyncConn, schema: str, state: RelayState) -> None:
    """Write the relay's row (its heartbeat)."""
    params = state.model_dump(exclude={"heartbeat_at"})
    await execute(conn, query("relay_report", schema), params)


async def forget(conn: AsyncConn, schema: str, name: str) -> None:
    await execute(conn, query("relay_forget", schema), {"name": name})


def list_plan(schema: str, within_seconds: float) -> Plan[list[RelayState]]:
    """The relays heard from lately, the leader first."""
    rows = yield query("relay_list", schema), {"within": within_seconds}
    return [_state(row) for row in rows]


def _state(row: tuple[object, ...]) -> RelayState:
    name, leading, started, beat, published, refused, failed, rate, error = row
    host, _, pid = str(name).rpartition(":")
    assert isinstance(started, datetime) and isinstance(beat, datetime)
    return RelayState(
        name=str(name), hostname=host, pid=int(pid), leading=bool(leading), started_at=started,
        heartbeat_at=beat, published=int(str(published)), refused=int(str(refused)),
        failed=int(str(failed)), per_second=float(str(rate)),
        last_error=None if error is None else str(error),
    )  # fmt: skip
