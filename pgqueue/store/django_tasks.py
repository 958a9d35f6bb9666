"""What the django.tasks backend (pgqueue/contrib/django/tasks.py) stores beyond a plain job:
runs sql/queries/django_tasks.sql on the caller's connection, in its transaction."""

from __future__ import annotations

from datetime import datetime

from pgqueue.queries import query
from pgqueue.store.plan import SyncConn


def keep_first_start(
    conn: SyncConn, schema: str, job_id: int, worker_id: int | None, started_at: datetime
) -> None:
    """Store when attempt 1 of the job started, while `worker_id` still runs that attempt."""
    params = {"id": job_id, "worker_id": worker_id, "started_at": started_at.isoformat()}
    conn.execute(query("job_keep_first_start", schema), params)
