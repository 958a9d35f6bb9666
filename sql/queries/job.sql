-- Statements an application runs on its own connection: enqueue and read back.

-- name: job_insert
-- Inserts a batch of jobs in one statement and wakes the workers of their queues at commit.
-- Rows arrive in input order, so ids come back in that order. A job whose run_at is in the
-- future is 'scheduled' and stays out of the claim index until it is promoted.
-- pg_notify is called once per distinct queue, and PostgreSQL collapses identical notifications
-- within a transaction, so listeners get at most one wake-up per transaction per queue.
WITH input AS (
    SELECT j.queue, j.task, j.args, j.priority, j.max_attempts, coalesce(j.atomic, false) AS atomic,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS run_at
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(queue text, task text, args jsonb, priority smallint, max_attempts integer,
              run_at timestamptz, delay double precision, atomic boolean)
), inserted AS (
    INSERT INTO {schema}.jobs (queue, task, args, priority, max_attempts, run_at, atomic, status)
    SELECT queue, task, args, priority, max_attempts, run_at, atomic,
           CASE WHEN run_at > coalesce(%(now)s::timestamptz, now())
                THEN 'scheduled' ELSE 'queued' END
    FROM input
    RETURNING id, queue, status
)
SELECT i.id
FROM inserted AS i
CROSS JOIN (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS woken
    FROM (SELECT DISTINCT queue FROM inserted) AS q
) AS n
ORDER BY i.id;

-- name: job_get
-- One job by id, from the hot table or, once finished, from history.
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result,
       dedupe_key, retry_of, cancel_requested_at, atomic
FROM {schema}.jobs WHERE id = %(id)s
UNION ALL
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, finished_at, worker_id, errors, result,
       dedupe_key, retry_of, NULL::timestamptz AS cancel_requested_at, atomic
FROM {schema}.job_history WHERE id = %(id)s
LIMIT 1;

-- name: job_list_live
-- Jobs still in the hot table (queued, scheduled, running), oldest first; for tests.
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result
FROM {schema}.jobs
WHERE %(task)s::text IS NULL OR task = %(task)s
ORDER BY id;
