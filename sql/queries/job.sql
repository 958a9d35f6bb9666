-- Statements an application runs on its own connection: enqueue and read back.

-- name: job_insert
-- Inserts a batch of jobs in one statement and wakes the workers of their queues at commit.
-- Rows arrive in input order, so ids come back in that order. A job whose run_at is in the
-- future is 'scheduled' and stays out of the claim index until it is promoted.
-- Wake-up: one wake() per queue that got queued rows, naming the lowest (priority, id) this
-- transaction made claimable there. A worker whose claim hint has passed that position (the
-- job committed late, or has a more urgent priority) claims from it next, instead of walking
-- the whole index from the start, dead entries included. The position is merged
-- with what earlier statements of the transaction announced (transaction-local setting
-- pgqueue.woken), so the payloads stay identical and PostgreSQL folds them: listeners get one
-- wake-up per transaction and queue, unless a later statement goes lower.
WITH input AS (
    SELECT j.queue, j.task, j.args, j.priority, j.max_attempts, coalesce(j.atomic, false) AS atomic,
           j.concurrency_key,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS run_at
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(queue text, task text, args jsonb, priority smallint, max_attempts integer,
              run_at timestamptz, delay double precision, atomic boolean, concurrency_key text)
), inserted AS (
    INSERT INTO {schema}.jobs
        (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key, status)
    SELECT queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key,
           CASE WHEN run_at > coalesce(%(now)s::timestamptz, now())
                THEN 'scheduled' ELSE 'queued' END
    FROM input
    RETURNING id, queue, status, priority
), announced AS (
    SELECT coalesce(nullif(current_setting('pgqueue.woken', true), ''), '{{}}')::jsonb AS woken
), lowest AS (
    SELECT DISTINCT ON (queue) queue, priority, id
    FROM (
        SELECT queue, priority, id FROM inserted WHERE status = 'queued'
        UNION ALL
        SELECT substr(e.key, length({wake_channel}) + 2), (e.value ->> 0)::smallint,
               (e.value ->> 1)::bigint
        FROM announced AS a, jsonb_each(a.woken) AS e
        WHERE starts_with(e.key, {wake_channel} || ' ')
    ) AS seen
    WHERE queue IN (SELECT queue FROM inserted WHERE status = 'queued')
    ORDER BY queue, priority, id
)
SELECT i.id
FROM inserted AS i
CROSS JOIN (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS woken,
           set_config('pgqueue.woken',
                      ((SELECT woken FROM announced)
                       || coalesce(jsonb_object_agg({wake_channel} || ' ' || l.queue,
                                                    jsonb_build_array(l.priority, l.id)),
                                   '{{}}'))::text,
                      true) AS remembered
    FROM lowest AS l
) AS n
ORDER BY i.id;

-- name: job_insert_one
-- One job in a transaction of its own (an autocommit enqueue, or the queue's pooled one):
-- job_insert's row without its JSON batch and without folding its wake-up with those of the
-- transaction's earlier statements, since there are none, which brings a lone enqueue close
-- to a bare INSERT. The wake-up names this job's (priority, id). Scheduled jobs wake nobody: promotion does.
INSERT INTO {schema}.jobs AS j
    (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key, status)
SELECT v.queue, v.task, v.args, v.priority, v.max_attempts, v.run_at, v.atomic, v.concurrency_key,
       CASE WHEN v.run_at > coalesce(%(now)s::timestamptz, now()) THEN 'scheduled' ELSE 'queued' END
FROM (VALUES (%(queue)s::text, %(task)s::text, %(args)s::jsonb, %(priority)s::smallint,
              %(max_attempts)s::integer,
              coalesce(%(run_at)s::timestamptz, coalesce(%(now)s::timestamptz, now())
                       + make_interval(secs => coalesce(%(delay)s::float8, 0))),
              %(atomic)s::boolean, %(concurrency_key)s::text))
     AS v(queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key)
RETURNING j.id,
          CASE WHEN j.status = 'queued'
               THEN {schema}.wake(j.queue, j.priority, j.id) END;

-- name: job_get
-- One job by id, from the hot table or, once finished, from history.
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result,
       dedupe_key, retry_of, cancel_requested_at, atomic, concurrency_key
FROM {schema}.jobs WHERE id = %(id)s
UNION ALL
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, finished_at, worker_id, errors, result,
       dedupe_key, retry_of, NULL::timestamptz AS cancel_requested_at, atomic, concurrency_key
FROM {schema}.job_history WHERE id = %(id)s
LIMIT 1;

-- name: job_list_live
-- Jobs still in the hot table (queued, scheduled, running), oldest first; for tests.
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result
FROM {schema}.jobs
WHERE %(task)s::text IS NULL OR task = %(task)s
ORDER BY id;

-- name: job_id_reserve
-- Takes %(n)s ids from the jobs id sequence, as one array, for a bulk enqueue by COPY
-- (pgqueue/bulk.py), which cannot return the ids it stores. Ids taken and not used (the
-- transaction rolls back) are gaps, as with any insert. The sequence is looked up once: as a
-- plain subquery it was pulled up and looked up again for every id.
WITH s AS MATERIALIZED (
    SELECT pg_get_serial_sequence(quote_ident({schema_name}) || '.jobs', 'id')::regclass AS seq
)
SELECT array_agg(nextval(s.seq))
FROM s, generate_series(1, %(n)s::integer);

-- name: job_copy
-- Bulk enqueue: rows of queued jobs with their reserved ids; every other column takes its
-- default (status 'queued', run_at and created_at now). Its wake-up is job_wake.
COPY {schema}.jobs (id, queue, task, args, priority, max_attempts, atomic, concurrency_key)
FROM STDIN;

-- name: job_wake
-- Wakes the workers of each queue with the lowest (priority, id) a bulk enqueue stored there,
-- at the commit of the caller's transaction (see job_insert). One row per queue.
SELECT count({schema}.wake(w.queue, w.priority, w.id))
FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(ids)s::bigint[])
     AS w(queue, priority, id);
