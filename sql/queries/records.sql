-- Statements for dedupe keys, job records, cancellation and retries. They run on the
-- caller's connection, except job_list_cancel_requested, which a worker runs.

-- name: job_insert_unique
-- Inserts jobs that carry a dedupe key, at most one live job per key, and returns for each input
-- row (by its ord) the id it resolves to and whether this statement created it. A key with a
-- live job, or with a window a job finished within it, resolves to that job; the first row of
-- a key within the batch is inserted otherwise. Race: ON CONFLICT DO NOTHING on
-- jobs_dedupe_key_idx waits for an uncommitted job with the same key; when that one commits,
-- nothing is inserted and, as it is invisible to this statement's snapshot, the id comes back
-- NULL: the caller runs the statement again for those rows, and the new statement's snapshot
-- (READ COMMITTED) sees it. Wakes workers exactly as job_insert does ('queue priority id').
WITH input AS (
    SELECT j.ord, j.queue, j.task, j.args, j.priority, j.max_attempts,
           coalesce(j.atomic, false) AS atomic, j.dedupe_key, j.dedupe_window, j.concurrency_key,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS run_at
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(ord integer, queue text, task text, args jsonb, priority smallint,
              max_attempts integer, run_at timestamptz, delay double precision, atomic boolean,
              dedupe_key text, dedupe_window double precision, concurrency_key text)
), recent AS (
    -- One index probe per key (a lateral LIMIT 1), whatever the table statistics say.
    SELECT k.dedupe_key, h.id
    FROM (SELECT dedupe_key, max(dedupe_window) AS dedupe_window
          FROM input WHERE dedupe_window IS NOT NULL GROUP BY dedupe_key) AS k
    CROSS JOIN LATERAL (
        SELECT h.id
        FROM {schema}.job_history AS h
        WHERE h.dedupe_key = k.dedupe_key
          AND h.finished_at >= coalesce(%(now)s::timestamptz, now())
                               - make_interval(secs => k.dedupe_window)
        ORDER BY h.finished_at DESC
        LIMIT 1
    ) AS h
), live AS (
    SELECT k.dedupe_key, j.id
    FROM (SELECT DISTINCT dedupe_key FROM input) AS k
    CROSS JOIN LATERAL (
        SELECT j.id FROM {schema}.jobs AS j WHERE j.dedupe_key = k.dedupe_key LIMIT 1
    ) AS j
), inserted AS (
    INSERT INTO {schema}.jobs
        (queue, task, args, priority, max_attempts, run_at, atomic, status, dedupe_key,
         concurrency_key)
    SELECT f.queue, f.task, f.args, f.priority, f.max_attempts, f.run_at, f.atomic,
           CASE WHEN f.run_at > coalesce(%(now)s::timestamptz, now())
                THEN 'scheduled' ELSE 'queued' END,
           f.dedupe_key, f.concurrency_key
    FROM (
        SELECT DISTINCT ON (i.dedupe_key) i.*
        FROM input AS i
        WHERE NOT EXISTS (SELECT 1 FROM recent AS r WHERE r.dedupe_key = i.dedupe_key)
        ORDER BY i.dedupe_key, i.ord
    ) AS f
    ORDER BY f.dedupe_key  -- one lock order for every batch: two batches never deadlock
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
    RETURNING id, dedupe_key, queue, status, priority
), announced AS (
    -- The wake-up is job_insert's, word for word from here on: keep the two alike.
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
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS woken,
           set_config('pgqueue.woken',
                      ((SELECT woken FROM announced)
                       || coalesce(jsonb_object_agg({wake_channel} || ' ' || l.queue,
                                                    jsonb_build_array(l.priority, l.id)),
                                   '{{}}'))::text,
                      true) AS remembered
    FROM lowest AS l
)
SELECT i.ord, coalesce(n.id, l.id, r.id) AS id,
       n.id IS NOT NULL AND i.ord = min(i.ord) OVER (PARTITION BY i.dedupe_key) AS created
FROM input AS i
LEFT JOIN inserted AS n ON n.dedupe_key = i.dedupe_key
LEFT JOIN live AS l ON l.dedupe_key = i.dedupe_key
LEFT JOIN recent AS r ON r.dedupe_key = i.dedupe_key
CROSS JOIN woken
ORDER BY i.ord;

-- name: job_dedupe_recheck
-- Keys just inserted whose window holds a job that finished after job_insert_unique took its
-- snapshot: the finish committed while the insert waited on the old row, so this statement's
-- newer snapshot is the one that sees it. The caller rolls back to its savepoint and retries.
SELECT DISTINCT k.dedupe_key
FROM jsonb_to_recordset(%(keys)s::jsonb) AS k(dedupe_key text, dedupe_window double precision)
JOIN {schema}.job_history AS h ON h.dedupe_key = k.dedupe_key
WHERE h.finished_at >= coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => k.dedupe_window);

-- name: dedupe_savepoint
-- Marks where a deduplicated insert starts, so a lost race undoes only that insert.
SAVEPOINT pgqueue_dedupe;

-- name: dedupe_rollback
-- Undoes a deduplicated insert that lost a race with a finishing job (see job_dedupe_recheck).
ROLLBACK TO SAVEPOINT pgqueue_dedupe;

-- name: dedupe_release
-- Keeps a deduplicated insert; the caller's transaction decides whether it commits.
RELEASE SAVEPOINT pgqueue_dedupe;

-- name: job_list
-- One page of job records, newest first, from the hot table and history, with optional filters
-- (NULL means any) and keyset pagination: pass the last id of a page as before_id. A branch
-- whose statuses cannot match is cut at plan time, so a live-only listing never reads history.
-- Time filters apply to created_at. A new filter is one parameter and one line per branch.
(SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
        started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result,
        dedupe_key, retry_of, cancel_requested_at, atomic, concurrency_key
 FROM {schema}.jobs
 WHERE (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(concurrency_key)s::text IS NULL OR concurrency_key = %(concurrency_key)s::text)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
 ORDER BY id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
        started_at, finished_at, worker_id, errors, result,
        dedupe_key, retry_of, NULL::timestamptz AS cancel_requested_at, atomic, concurrency_key
 FROM {schema}.job_history
 WHERE (%(statuses)s::text[] IS NULL
        OR %(statuses)s::text[] && ARRAY['succeeded', 'failed', 'cancelled'])
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(concurrency_key)s::text IS NULL OR concurrency_key = %(concurrency_key)s::text)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
 ORDER BY id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_cancel
-- Cancels one job. A queued or scheduled job moves to history as cancelled at once; a running
-- one gets cancel_requested_at, and its worker hears wake_cancel(id) on the wake-up channel at
-- commit. The row is taken FOR UPDATE SKIP LOCKED, so a
-- claim in flight or a running atomic job (which holds its row) is never waited on: `locked`
-- is then 0 and the caller looks again. The status guards keep the two branches apart; a row
-- claimed after this statement's snapshot matches neither, and the caller runs it again.
WITH target AS (
    SELECT id FROM {schema}.jobs WHERE id = %(id)s FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs AS j
    USING target AS t
    WHERE j.id = t.id AND j.status IN ('queued', 'scheduled', 'waiting')
    RETURNING j.id, j.queue, j.task, j.args, 'cancelled'::text AS status, j.priority, j.attempt,
              j.max_attempts, j.run_at, j.created_at, j.started_at,
              coalesce(%(now)s::timestamptz, now()) AS finished_at, j.worker_id, j.errors,
              NULL::jsonb AS result, j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key)
    SELECT * FROM gone
    WHERE %(keep_history)s
    RETURNING id
), requested AS (
    UPDATE {schema}.jobs AS j
    SET cancel_requested_at = coalesce(j.cancel_requested_at, %(now)s::timestamptz, now())
    FROM target AS t
    WHERE j.id = t.id AND j.status = 'running'
    RETURNING j.id
), told AS (
    SELECT count({schema}.wake_cancel(r.id)) AS told FROM requested AS r
)
SELECT (SELECT count(*) FROM target) AS locked,
       (SELECT count(*) FROM gone) AS cancelled,
       (SELECT told FROM told) AS requested;

-- name: job_retry_source
-- The finished job a retry copies, and the id of a retry of it still queued or running (the
-- caller refuses a second one; jobs_retry_of_idx closes the race between two retries).
SELECT h.id, h.queue, h.task, h.args, h.status, h.priority, h.max_attempts, h.atomic,
       (SELECT j.id FROM {schema}.jobs AS j WHERE j.retry_of = h.id) AS live_retry,
       h.concurrency_key
FROM {schema}.job_history AS h
WHERE h.id = %(id)s;

-- name: job_link_retry
-- Links a job just inserted by job_insert (in this transaction) to the job it retries.
-- Guard: only an unlinked row; a second live retry of the same job violates jobs_retry_of_idx.
UPDATE {schema}.jobs SET retry_of = %(retry_of)s WHERE id = %(id)s AND retry_of IS NULL;

-- name: job_list_cancel_requested
-- Those of this worker's running jobs `ids` whose cancellation was requested: the fallback
-- for a lost NOTIFY. By primary key, like job_finish_many (worker.sql): jobs_running_idx
-- would walk an entry for every job this worker ran while a long transaction holds the horizon.
SELECT id
FROM {schema}.jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status = (SELECT 'running'::text)
  AND worker_id = %(worker_id)s AND cancel_requested_at IS NOT NULL;

-- name: job_cancel_pause
-- A short wait between two tries of job_cancel on a row a claim or completion holds locked.
SELECT pg_sleep(%(seconds)s);
