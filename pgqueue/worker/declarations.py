"""Writes the tasks a worker runs to the database as it starts (store/tasks.py), so that a
job enqueued from SQL gets its task's declared queue, attempts and the rest, as one enqueued
from Python does. A worker whose role may not write them, or whose schema predates them,
says so and runs on: only jobs from SQL miss the declarations, and the warning names the fix.
"""

from __future__ import annotations

import logging

import psycopg

from pgqueue.registry import Registry
from pgqueue.runtime.link import Link
from pgqueue.store.plan import run_async
from pgqueue.store.tasks import sync_plan

log = logging.getLogger("pgqueue.worker")


async def sync_declarations(link: Link, schema: str, registry: Registry) -> list[str]:
    """Write the registry's declarations; the names that were new or changed (none when
    they could not be written)."""
    declared = registry.declarations()
    try:
        synced = await link.run(lambda conn: run_async(conn, sync_plan(schema, declared)))
    except psycopg.errors.InsufficientPrivilege:
        log.warning(
            "this worker's role may not write %s.tasks: jobs enqueued from SQL get its "
            "tasks' declared options only once `pgqueue grant worker ROLE` has been run",
            schema,
        )
        return []
    except psycopg.errors.UndefinedTable:
        log.warning(
            "schema %s has no tasks table: run `pgqueue migrate` so that jobs enqueued from "
            "SQL get their tasks' declared options",
            schema,
        )
        return []
    if synced:
        log.info("task declarations written for SQL enqueues: %s", ", ".join(synced))
    return synced
