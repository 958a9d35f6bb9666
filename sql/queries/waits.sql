-- Waiting for jobs' results (pgqueue/queue/waiting.py): the waiters' rows (migration 0027), their
-- channel, and the outcomes they read. Every statement runs on the one connection that a
-- Queue's waiters share and that LISTENs, so a row's session is the statement's own.

-- name: wait_listen
-- Subscribes to the schema's done channel (pgqueue/queue/waiting.py reads its payloads).
LISTEN {done};

-- name: wait_register
-- Registers this session's interest in jobs `ids`, so that their finish notifies it. A job
-- already registered by this session keeps its row.
INSERT INTO {schema}.result_waiters (job_id, pid, backend_start)
SELECT i.id, pg_backend_pid(), a.backend_start
FROM unnest(%(ids)s::bigint[]) AS i(id)
CROSS JOIN (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) AS a
ON CONFLICT (job_id, pid) DO NOTHING;

-- name: wait_unregister
-- Ends this session's waits for jobs `ids` (every one of them, when `ids` is NULL).
DELETE FROM {schema}.result_waiters
WHERE pid = pg_backend_pid()
  AND (%(ids)s::bigint[] IS NULL OR job_id = ANY(%(ids)s::bigint[]));

-- name: wait_sweep
-- Deletes the rows of sessions that are gone: a waiting process that died, or whose
-- connection broke. A session is the same one only with the same pid and start; a start this
-- role may not see (another role's session) keeps the row while its pid lives.
DELETE FROM {schema}.result_waiters AS r
WHERE NOT EXISTS (
    SELECT 1 FROM pg_stat_activity AS a
    WHERE a.pid = r.pid AND (a.backend_start IS NULL OR a.backend_start = r.backend_start)
);

-- name: wait_outcomes
-- Of jobs `ids`, those that are no longer live: each one's status, result and errors from
-- history, or NULLs when history has no record of it (it never existed, or it finished with
-- history off, or its record was pruned). One snapshot: a job moves from the hot table to
-- history in one statement, so it is seen in one place or the other. History is read only
-- for the jobs missing from the hot table, which are few: those just finished.
WITH gone AS MATERIALIZED (
    SELECT i.id FROM unnest(%(ids)s::bigint[]) AS i(id)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.id = i.id)
)
SELECT g.id, h.status, h.result, h.errors
FROM gone AS g
LEFT JOIN LATERAL (
    SELECT status, result, errors FROM {schema}.job_history AS h WHERE h.id = g.id LIMIT 1
) AS h ON true;
