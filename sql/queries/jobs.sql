-- The jobs table and its history, everything that moves a job: enqueue (one, many, with dedupe
-- keys, by COPY), claim, promotion, outcomes, put-backs, rescue, cancellation, retry and reads.
-- A worker runs its statements on its own connections in autocommit, each its own transaction;
-- an application runs the others on its own connection, inside its transaction.

-- name: job_insert
-- Inserts a batch of jobs in one statement and wakes the workers of their queues at commit.
-- trace_context, NULL unless tracing is on, is the enqueue span's (one per call), for every
-- job of the batch; the enqueues below take it too. Rows arrive in input order, so ids come back in that order. A job whose run_at is in the
-- future is 'scheduled' and stays out of the claim index until it is promoted.
-- Wake-up: one wake_new() per queue that got queued rows, naming the lowest (priority, id) this
-- transaction made claimable there. A worker whose claim hint has passed that position (the
-- job committed late, or has a more urgent priority) claims from it next, instead of walking
-- the whole index from the start, dead entries included. The position is merged
-- with what earlier statements of the transaction announced (transaction-local setting
-- pgqueue.woken), so the payloads stay identical and PostgreSQL folds them: listeners get one
-- wake-up per transaction and queue, unless a later statement goes lower.
WITH input AS (
    SELECT j.queue, j.task, j.args, j.priority, j.max_attempts, coalesce(j.atomic, false) AS atomic,
           j.concurrency_key, j.limit_keys, j.fairness_key, j.vtime, j.tags,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS run_at
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(queue text, task text, args jsonb, priority smallint, max_attempts integer,
              run_at timestamptz, delay double precision, atomic boolean, concurrency_key text,
              limit_keys text[], fairness_key text, vtime double precision, tags text[])
), inserted AS (
    INSERT INTO {schema}.jobs
        (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key,
         limit_keys, fairness_key, vtime, tags, trace_context, status)
    SELECT queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key,
           limit_keys, fairness_key, vtime, tags, %(trace_context)s::jsonb,
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
    SELECT count({schema}.wake_new(l.queue, l.priority, l.id)) AS woken,
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
-- to a bare INSERT: a single-row VALUES, which costs the server less than a SELECT from one
-- (bench enqueue-scale). The wake-up names this job's (priority, id). Scheduled jobs wake
-- nobody: promotion does. Whether a worker wants the wake-up is asked inside wake_new(), not
-- here, though a check in this statement would cost the server less: its query takes
-- its snapshot after this row's insert gave the transaction its id, and the workers'
-- widening relies on that (sql/migrations/0015_quiet_wake.sql); this statement's snapshot
-- is taken before.
INSERT INTO {schema}.jobs AS j
    (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key, tags,
     trace_context, status)
VALUES (%(queue)s::text, %(task)s::text, %(args)s::jsonb, %(priority)s::smallint,
        %(max_attempts)s::integer,
        coalesce(%(run_at)s::timestamptz, coalesce(%(now)s::timestamptz, now())
                 + make_interval(secs => coalesce(%(delay)s::float8, 0))),
        %(atomic)s::boolean, %(concurrency_key)s::text, %(tags)s::text[],
        %(trace_context)s::jsonb,
        CASE WHEN coalesce(%(run_at)s::timestamptz, coalesce(%(now)s::timestamptz, now())
                           + make_interval(secs => coalesce(%(delay)s::float8, 0)))
                  > coalesce(%(now)s::timestamptz, now())
             THEN 'scheduled' ELSE 'queued' END)
RETURNING j.id,
          CASE WHEN j.status = 'queued'
               THEN {schema}.wake_new(j.queue, j.priority, j.id) END;

-- name: job_insert_single
-- One job inside a longer transaction: job_insert_one's row, stored by insert_job(), whose
-- INSERT keeps its plan for the session even where the connection prepares nothing (Django's
-- default, PgBouncer's usual setting), and whose wake-up is folded with those of the
-- transaction's other statements by wake_once().
SELECT {schema}.insert_job(%(queue)s::text, %(task)s::text, %(args)s::jsonb,
                           %(priority)s::smallint, %(max_attempts)s::integer,
                           %(run_at)s::timestamptz, %(delay)s::float8, %(now)s::timestamptz,
                           %(atomic)s::boolean, %(concurrency_key)s::text, %(tags)s::text[],
                           %(trace_context)s::jsonb);

-- name: job_get
-- One job by id, from the hot table or, once finished, from history.
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result,
       dedupe_key, retry_of, cancel_requested_at, atomic, concurrency_key, workflow_id,
       progress, tags, limit_keys, fairness_key
FROM {schema}.jobs WHERE id = %(id)s
UNION ALL
SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
       started_at, finished_at, worker_id, errors, result,
       dedupe_key, retry_of, NULL::timestamptz AS cancel_requested_at, atomic, concurrency_key,
       workflow_id, progress, tags, limit_keys, fairness_key
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
-- plain subquery it was pulled up and looked up again for every id. The transaction takes
-- its id before the job ids, as every insert into jobs does (sql/migrations/0035_steady_wake.sql):
-- the materialized row is made before the first nextval.
WITH s AS MATERIALIZED (
    SELECT pg_get_serial_sequence(quote_ident({schema_name}) || '.jobs', 'id')::regclass AS seq,
           pg_current_xact_id() AS xid
)
SELECT array_agg(nextval(s.seq))
FROM s, generate_series(1, %(n)s::integer)
WHERE s.xid IS NOT NULL;

-- name: job_copy
-- Bulk enqueue: rows of queued jobs with their reserved ids; every other column takes its
-- default (status 'queued', run_at and created_at now). Its wake-up is job_wake.
COPY {schema}.jobs (id, queue, task, args, priority, max_attempts, atomic, concurrency_key)
FROM STDIN;

-- name: job_copy_traced
-- job_copy with the enqueue span's trace context on every row (tracing on).
COPY {schema}.jobs (id, queue, task, args, priority, max_attempts, atomic, concurrency_key,
                    trace_context)
FROM STDIN;

-- name: job_wake
-- Wakes the workers of each queue with the lowest (priority, id) a bulk enqueue stored there,
-- at the commit of the caller's transaction (see job_insert). One row per queue.
SELECT count({schema}.wake_new(w.queue, w.priority, w.id))
FROM unnest(%(queues)s::text[], %(priorities)s::smallint[], %(ids)s::bigint[])
     AS w(queue, priority, id);

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
           j.limit_keys, j.fairness_key, j.vtime, j.tags,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS run_at
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(ord integer, queue text, task text, args jsonb, priority smallint,
              max_attempts integer, run_at timestamptz, delay double precision, atomic boolean,
              dedupe_key text, dedupe_window double precision, concurrency_key text,
              limit_keys text[], fairness_key text, vtime double precision, tags text[])
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
         concurrency_key, limit_keys, fairness_key, vtime, tags, trace_context)
    SELECT f.queue, f.task, f.args, f.priority, f.max_attempts, f.run_at, f.atomic,
           CASE WHEN f.run_at > coalesce(%(now)s::timestamptz, now())
                THEN 'scheduled' ELSE 'queued' END,
           f.dedupe_key, f.concurrency_key, f.limit_keys, f.fairness_key, f.vtime, f.tags,
           %(trace_context)s::jsonb
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
    SELECT count({schema}.wake_new(l.queue, l.priority, l.id)) AS woken,
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
-- after_id bounds the walk from below: a filter that matches rarely reads at most the ids
-- between after_id and before_id, however long history is (the dashboard's search window).
-- Time filters apply to created_at. A new filter is one parameter and one line per branch.
(SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
        started_at, NULL::timestamptz AS finished_at, worker_id, errors, NULL::jsonb AS result,
        dedupe_key, retry_of, cancel_requested_at, atomic, concurrency_key, workflow_id,
        progress, tags, limit_keys, fairness_key
 FROM {schema}.jobs
 WHERE (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
   AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(concurrency_key)s::text IS NULL OR concurrency_key = %(concurrency_key)s::text)
   AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
   AND (%(workflow)s::bigint IS NULL OR workflow_id = %(workflow)s::bigint)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
 ORDER BY id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
        started_at, finished_at, worker_id, errors, result,
        dedupe_key, retry_of, NULL::timestamptz AS cancel_requested_at, atomic, concurrency_key,
        workflow_id, progress, tags, limit_keys, fairness_key
 FROM {schema}.job_history
 WHERE (%(statuses)s::text[] IS NULL
        OR %(statuses)s::text[] && ARRAY['succeeded', 'failed', 'cancelled'])
   AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
   AND (%(after_id)s::bigint IS NULL OR id > %(after_id)s::bigint)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(task)s::text IS NULL OR task = %(task)s::text)
   AND (%(concurrency_key)s::text IS NULL OR concurrency_key = %(concurrency_key)s::text)
   AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
   AND (%(workflow)s::bigint IS NULL OR workflow_id = %(workflow)s::bigint)
   AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
   AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
   AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
 ORDER BY id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_read_newest_id
-- The newest job id, live or finished: one step down each primary key (history's partitions
-- are merged by their own). NULL when there is no job at all.
SELECT greatest((SELECT max(id) FROM {schema}.jobs), (SELECT max(id) FROM {schema}.job_history));

-- name: job_cancel
-- Cancels one job. A queued, scheduled or blocked job moves to history as cancelled at once,
-- and what waits for it is settled (workflow_settle); a running
-- one gets cancel_requested_at, and its worker hears wake_cancel(id) on the wake-up channel at
-- commit. The row is taken FOR UPDATE SKIP LOCKED, so a
-- claim in flight or a running atomic job (which holds its row) is never waited on: `locked`
-- is then 0 and the caller looks again. The status guards keep the two branches apart; a row
-- claimed after this statement's snapshot matches neither, and the caller runs it again.
WITH waits AS (
    -- A blocked job's count first, as workflow_settle takes it before the job's row: the
    -- finish of its last dependency holds the count while it releases the job, and would
    -- otherwise wait for this statement while this one waits for it.
    SELECT job_id FROM {schema}.job_waits WHERE job_id = %(id)s FOR UPDATE
), target AS (
    SELECT id FROM {schema}.jobs
    WHERE id = %(id)s AND (SELECT count(*) FROM waits) >= 0
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs AS j
    USING target AS t
    WHERE j.id = t.id AND j.status IN ('queued', 'scheduled', 'waiting', 'blocked')
    RETURNING j.id, j.queue, j.task, j.args, 'cancelled'::text AS status, j.priority, j.attempt,
              j.max_attempts, j.run_at, j.created_at, j.started_at,
              coalesce(%(now)s::timestamptz, now()) AS finished_at, j.worker_id, j.errors,
              NULL::jsonb AS result, j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key,
              j.workflow_id, j.progress, j.tags, j.limit_keys, j.fairness_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key, workflow_id, progress, tags, limit_keys, fairness_key)
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
), settled AS (
    -- What waits for the cancelled job (migration 0010): cancelled too, or run, by its option.
    SELECT {schema}.workflow_settle(array_agg(g.id), array_agg(g.status), array_agg(g.result),
                                    %(keep_history)s) AS n
    FROM gone AS g WHERE g.workflow_id IS NOT NULL HAVING count(*) > 0
), waiters AS (
    -- Whoever waits for the cancelled job hears of it at commit (migration 0027).
    SELECT {schema}.notify_waiters(ARRAY(SELECT g.id FROM gone AS g)) AS n
)
SELECT (SELECT count(*) FROM target) AS locked,
       (SELECT count(*) FROM gone) AS cancelled,
       (SELECT told FROM told) AS requested,
       (SELECT n FROM settled) AS settled,
       (SELECT n FROM waiters) AS waiters;

-- name: job_retry_source
-- The finished job a retry copies, and the id of a retry of it still queued or running (the
-- caller refuses a second one; jobs_retry_of_idx closes the race between two retries).
SELECT h.id, h.queue, h.task, h.args, h.status, h.priority, h.max_attempts, h.atomic,
       (SELECT j.id FROM {schema}.jobs AS j WHERE j.retry_of = h.id) AS live_retry,
       h.concurrency_key, h.tags, h.limit_keys, h.fairness_key
FROM {schema}.job_history AS h
WHERE h.id = %(id)s;

-- name: job_link_retry
-- Links a job just inserted by job_insert (in this transaction) to the job it retries.
-- Guard: only an unlinked row; a second live retry of the same job violates jobs_retry_of_idx.
UPDATE {schema}.jobs SET retry_of = %(retry_of)s WHERE id = %(id)s AND retry_of IS NULL;

-- name: job_list_cancel_requested
-- Those of this worker's running jobs `ids` whose cancellation was requested: the fallback
-- for a lost NOTIFY. By primary key, like job_finish_many: jobs_running_idx
-- would walk an entry for every job this worker ran while a long transaction holds the horizon.
SELECT id
FROM {schema}.jobs
WHERE id = ANY(%(ids)s::bigint[]) AND status = (SELECT 'running'::text)
  AND worker_id = %(worker_id)s AND cancel_requested_at IS NOT NULL;

-- name: job_cancel_pause
-- A short wait between two tries of job_cancel on a row a claim or completion holds locked.
SELECT pg_sleep(%(seconds)s);

-- name: job_claim
-- Claims up to %(limit)s queued jobs of one queue in (priority, id) order, skipping rows other
-- workers hold, between two positions. The row comparisons are the start and stop bounds of
-- an index range scan on jobs_claim_idx, so dead entries outside the range are never visited
-- even while a long transaction keeps them. The floor (-32768, 0) and the ceiling (32767, max bigint) claim everything.
-- A row updated concurrently is re-checked against status = 'queued' when its lock is taken,
-- so a job is never claimed twice. A paused queue is never claimed: its workers leave it out
-- (pgqueue/claimer.py), so this statement pays nothing for pausing.
-- Jobs with limit keys (concurrency_key and limit_keys) are admitted by concurrency_admit
-- (migration 0029): it locks the slot rows of all their keys in key order (so two claims
-- never deadlock on slots), reads each counter's latest version under its lock, and admits a
-- job only if every one of its keys has room, so running never exceeds a limit whatever the
-- number of claimers. Picked jobs that do not fit are parked ('waiting', out of the claim
-- index) and returned with parked = true so the hint moves past them; a saturated key's other
-- queued jobs are parked too, up to 100,000 per key per claim, so no later claim walks them
-- (fairness).
-- Jobs without a key only pass through an empty function call (bench/tenants/suite.py
-- measures that).
WITH picked AS (
    SELECT id, priority, concurrency_key IS NOT NULL OR limit_keys IS NOT NULL AS keyed
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND NOT atomic
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)
    ORDER BY priority, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), admission AS (
    SELECT a.job, a.fits
    FROM {schema}.concurrency_admit(ARRAY(SELECT id FROM picked WHERE keyed ORDER BY priority, id),
                                    ARRAY(SELECT id FROM picked)) AS a
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        started_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = %(worker_id)s
    -- = ANY(ARRAY(...)): primary-key lookups in a generic plan too, where a join with picked
    -- (estimated at a tenth of the queue) became a sequential scan of jobs.
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked WHERE NOT keyed
                           UNION ALL SELECT job FROM admission WHERE fits))
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
              j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked,
       trace_context, waited
FROM claimed
UNION ALL
SELECT p.id, NULL, NULL, p.priority, NULL, NULL, NULL, NULL, true, NULL, NULL
FROM picked AS p JOIN admission AS a ON a.job = p.id
WHERE NOT a.fits;

-- name: job_claim_rated
-- job_claim under rate limits: a queue's (migration 0011) and its jobs' tasks' and keys'
-- (migration 0012). It claims no more jobs than the queue's limit has room for at this
-- claim's time, which is also their started_at; admits each picked job only if its task and
-- key have room, putting the others back as scheduled for when they do (returned as parked,
-- so the hint moves past them); and records the starts. Its last row, with id NULL, says in
-- how many seconds the queue has room again (0: now), so a worker that got fewer jobs than
-- it asked for waits that long before it claims the queue again, and in how many seconds the
-- first job put back falls due. Workers run it for queues with a limit, and while some task
-- or key has one, for queues where they met a job with a key or of a limited task
-- (pgqueue/claimer.py). It is job_claim with these changes, kept in step
-- with it: the queue_limit and allowance CTEs, picked's LIMIT and task, the admitted and
-- entering CTEs, and the recorded and room CTEs with its last row. A statement of its own,
-- so that job_claim pays nothing for rate limits.
-- Every limit holds where its jobs' handlers start, not only at the claim: a handler starts
-- up to the start margin after its claim's time (the worker puts back, attempt unspent, a
-- job of this claim it could not start by then), so the claim counts the starts of a period
-- and that margin before it, the queue's here and the tasks' and keys' in job_rate_admit
-- (migration 0025), and no period-long window of handler starts holds more than the limit,
-- however the starts of two claims a period apart are delayed in their workers
-- (test_rate_limits.py and test_job_rate_limits.py record handlers' starts and check every
-- window).
WITH queue_limit AS (
    -- Locks the queue's rate_limits row until this claim commits: claims of a limited queue
    -- take turns here, each counting the starts of those before it.
    SELECT max_starts, period + %(start_margin)s::interval AS reach, starts, counts
    FROM {schema}.rate_limits
    WHERE queue = %(queue)s
    FOR UPDATE
), allowance AS (
    SELECT coalesce(
        (SELECT greatest(least(%(limit)s, l.max_starts - {schema}.rate_used(
                    l.starts, l.counts, l.reach, coalesce(%(now)s::timestamptz, now()))), 0)
         FROM queue_limit AS l),
        %(limit)s) AS n
), picked AS (
    SELECT id, priority, task, {schema}.job_keys(concurrency_key, limit_keys) AS keys,
           concurrency_key IS NOT NULL OR limit_keys IS NOT NULL AS keyed
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND NOT atomic
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)
    ORDER BY priority, id
    LIMIT (SELECT n FROM allowance)
    FOR UPDATE SKIP LOCKED
), admitted AS (
    -- Locks the picked jobs' tasks' and keys' limits (0012, 0025, 0029), and puts back the
    -- jobs over them, each for when a window of its period and the start margin has room;
    -- with %(job_limits)s false (no task or key has a limit) it is not called at all.
    SELECT a.job, a.back_at
    FROM {schema}.job_rate_admit_keys(
        ARRAY(SELECT id FROM picked ORDER BY priority, id),
        ARRAY(SELECT task FROM picked ORDER BY priority, id),
        (SELECT coalesce(jsonb_agg(coalesce(to_jsonb(keys), '[]'::jsonb) ORDER BY priority, id),
                         '[]'::jsonb)
         FROM picked),
        coalesce(%(now)s::timestamptz, now()),
        %(start_margin)s::interval) AS a
    WHERE %(job_limits)s::boolean
    UNION ALL
    SELECT id, NULL::timestamptz FROM picked WHERE NOT %(job_limits)s::boolean
), entering AS (
    SELECT p.* FROM picked AS p JOIN admitted AS a ON a.job = p.id WHERE a.back_at IS NULL
), admission AS (
    SELECT a.job, a.fits
    FROM {schema}.concurrency_admit(
        ARRAY(SELECT id FROM entering WHERE keyed ORDER BY priority, id),
        ARRAY(SELECT id FROM picked)) AS a
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        started_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = %(worker_id)s
    -- = ANY(ARRAY(...)) here and in parked: primary-key lookups in a generic plan too, where
    -- a join with picked (estimated at a tenth of the queue) became a sequential scan of jobs.
    WHERE j.id = ANY(ARRAY(SELECT id FROM entering WHERE NOT keyed
                           UNION ALL SELECT job FROM admission WHERE fits))
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
              {schema}.job_keys(j.concurrency_key, j.limit_keys) AS keys, j.trace_context,
              extract(epoch FROM j.started_at - j.run_at)::float8 AS waited
), recorded AS (
    -- The claimed jobs' starts, at their started_at.
    SELECT {schema}.rate_record(%(queue)s, (SELECT count(*) FROM claimed)::integer,
                                coalesce(%(now)s::timestamptz, now())) AS queue_recorded,
           CASE WHEN %(job_limits)s::boolean
                THEN {schema}.job_rate_record(ARRAY(SELECT task FROM claimed),
                                              ARRAY(SELECT k FROM claimed AS c, unnest(c.keys) AS k),
                                              coalesce(%(now)s::timestamptz, now()))
                ELSE 0 END AS jobs_recorded
), room AS (
    -- In how many seconds the queue has room again, counting its starts as the allowance
    -- does (a period and the margin back), this claim's included; 0: now, or no limit.
    SELECT CASE WHEN {schema}.rate_used(p.kept_starts, p.kept_counts, l.reach,
                                        coalesce(%(now)s::timestamptz, now())) < l.max_starts
                THEN 0
                ELSE {schema}.rate_room_in(p.kept_starts, p.kept_counts, l.reach, l.max_starts,
                                           coalesce(%(now)s::timestamptz, now()))
           END AS room_in
    FROM queue_limit AS l,
         {schema}.rate_push(l.starts, l.counts, coalesce(%(now)s::timestamptz, now()),
                            (SELECT count(*) FROM claimed)::integer, l.max_starts) AS p
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked,
       trace_context, waited, NULL::float8 AS room_in, NULL::float8 AS back_in
FROM claimed
UNION ALL
SELECT p.id, NULL, NULL, p.priority, NULL, NULL, NULL, NULL, true, NULL, NULL, NULL, NULL
FROM entering AS p JOIN admission AS a ON a.job = p.id
WHERE NOT a.fits
UNION ALL
SELECT p.id, NULL, NULL, p.priority, NULL, NULL, NULL, NULL, true, NULL, NULL, NULL, NULL
FROM picked AS p JOIN admitted AS a ON a.job = p.id WHERE a.back_at IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       coalesce((SELECT room_in FROM room), 0),
       (SELECT extract(epoch FROM min(back_at) - coalesce(%(now)s::timestamptz, now()))::float8
        FROM admitted)
FROM recorded
WHERE jobs_recorded IS NOT NULL AND queue_recorded IS NOT NULL;

-- name: job_claim_unkeyed
-- job_claim for a queue whose jobs carry no concurrency key, at the cost of the claim before
-- keys existed (bench/tenants/suite.py): same range scan, same guard. If a picked job has a key,
-- or its task is one of %(limited_tasks)s (those with a rate limit), it claims nothing and
-- says so in its last row, parked true: the worker switches that queue to job_claim, or to
-- job_claim_rated while tasks or keys have limits, and claims again (the locks are released
-- at once, this being its own statement). That last row, without an id, is always there: it
-- carries the transactions in progress in the statement's snapshot, as numbers. A job the
-- claim passed unseen and that commits later, below the hint, belongs to one of them
-- (sql/migrations/0035_steady_wake.sql). A snapshot names them only below its xmax, the
-- newest transaction to have ended: the row also gives that xmax and the claim's own
-- transaction id, drawn by its UPDATE after the snapshot was taken (this branch runs after
-- the first), so every transaction in progress unnamed lies between the two.
WITH picked AS (
    SELECT id, concurrency_key IS NOT NULL OR limit_keys IS NOT NULL OR vtime IS NOT NULL
               OR task = ANY(%(limited_tasks)s::text[]) AS keyed
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND NOT atomic
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)
    ORDER BY priority, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), keyed AS (
    SELECT EXISTS (SELECT 1 FROM picked WHERE keyed) AS found
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        started_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = %(worker_id)s
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND NOT (SELECT found FROM keyed)
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
              j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked,
       trace_context, waited, NULL::bigint[] AS xip, NULL::bigint AS xmax, NULL::bigint AS xid
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT found FROM keyed), NULL, NULL,
       ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(pg_current_snapshot()) AS x),
       pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
       pg_current_xact_id_if_assigned()::text::bigint;

-- name: job_sweep_find
-- One slice of the safety net's sweep (pgqueue/worker/sweep.py): the queued jobs of the queue
-- at or before the hint whose row lies in the heap pages [lo, hi), the first %(limit)s in
-- claim order, and how many pages the table has now. A TID range scan: it reads the slice's
-- pages once each and no other, so its walk is bounded by the slice however many dead rows
-- a long transaction keeps, and whatever the jobs' priorities and ids. The status is compared
-- with a value the planner does not know, so that it cannot pick jobs_claim_idx instead (with
-- the ORDER BY and LIMIT, it did): that walk would be the claim from the floor again.
WITH found AS (
    SELECT j.priority::integer AS priority, j.id
    FROM {schema}.jobs AS j
    WHERE j.ctid >= %(lo)s::tid AND j.ctid < %(hi)s::tid
      AND j.queue = %(queue)s
      AND j.status = (SELECT 'queued'::text)
      AND NOT j.atomic
      AND (j.priority, j.id) <= (%(hint_priority)s::smallint, %(hint_id)s::bigint)
    ORDER BY j.priority, j.id
    LIMIT %(limit)s
)
SELECT pg_relation_size((quote_ident({schema_name}) || '.jobs')::regclass)
           / current_setting('block_size')::bigint AS pages,
       coalesce((SELECT array_agg(f.priority ORDER BY f.priority, f.id) FROM found AS f),
                '{{}}') AS priorities,
       coalesce((SELECT array_agg(f.id ORDER BY f.priority, f.id) FROM found AS f),
                '{{}}') AS ids;

-- name: job_promote_due
-- Moves due scheduled jobs of these queues to queued, oldest first, in a bounded batch, and
-- returns in how many seconds the next one falls due, so the worker can sleep until then: as
-- seconds, not a time, by the server's clock, and readable whatever run_at holds (a time past
-- what Python can represent, or infinity, which is an infinite wait). SKIP LOCKED lets
-- several workers promote at once without waiting on each other. Promoted jobs keep their ids,
-- which claim hints have usually passed: the wake-up names the lowest (priority, id) promoted
-- per queue, so every worker claims from there next (see job_insert).
WITH due AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s::text[])
      AND status = 'scheduled'
      AND run_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY queue, run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    -- By the due ids, never a join: with statistics taken while the table held a job or
    -- two, the generic plan walked the whole primary key to join it to the due jobs, every
    -- dead entry a long transaction keeps (test_claim_session_plans.py).
    UPDATE {schema}.jobs AS j SET status = 'queued'
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING j.id, j.queue, j.priority
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
    FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM promoted
          ORDER BY queue, priority, id) AS l
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       -- The first entry of each queue's range of jobs_scheduled_idx, not a min() over
       -- every later scheduled job, which read all of them (parked durable jobs, say) at
       -- every promotion.
       (SELECT extract(epoch FROM min(n.run_at))::float8
               - extract(epoch FROM coalesce(%(now)s::timestamptz, now()))::float8
        FROM unnest(%(queues)s::text[]) AS q(queue)
        CROSS JOIN LATERAL (
            SELECT s.run_at FROM {schema}.jobs AS s
            WHERE s.queue = q.queue AND s.status = 'scheduled'
              AND s.run_at > coalesce(%(now)s::timestamptz, now())
            ORDER BY s.run_at
            LIMIT 1) AS n) AS next_due_in,
       (SELECT n FROM woken) AS woken;

-- name: job_finish_many
-- Writes a batch of outcomes in one statement. Finished jobs (succeeded, failed, cancelled)
-- leave the hot table and, unless history is off, land in job_history in the same statement;
-- retried jobs go back to scheduled (or queued when due now) with the error appended (a snooze
-- goes back the same way, its attempt given back and no error recorded); those
-- queued now wake the workers with their lowest (priority, id) per queue (see job_insert);
-- finished ones that someone waits for (Queue.wait) tell their waiters.
-- Guard: a row moves only while it is still running this attempt for the worker that claimed it
-- (each outcome names it: the worker itself, or the rescuer acting for a dead one), so a late or
-- duplicate write cannot move a job that was put back, rescued or finished elsewhere.
-- A retry of a job whose cancellation was requested ends it as cancelled instead.
-- Each job row finds its outcome by key in one jsonb object (`batch.m`, an InitPlan computed
-- once; the worker sends it keyed by id, with the ids and the retried ids beside it, so the
-- server builds nothing from an array first), never by a join with the outcomes: whatever
-- the statistics say, a write costs O(batch). A join was planned as a nested loop over every
-- outcome for every row (quadratic), or with stale statistics (a table analysed while empty)
-- as a walk of every running row once per outcome.
-- The running guard compares with `(SELECT 'running'::text)`, a value the planner does not
-- know, rather than a constant, so it cannot select the partial index jobs_running_idx: while
-- a long transaction holds the horizon that index keeps an entry for every job that ever ran,
-- and a batch walking it slows with every job run meanwhile (test_finish_plan.py).
-- `retries` holds only the retried ids: a batch without retries never calls retry_outcomes,
-- and one with some reads only their rows.
WITH batch AS MATERIALIZED (
    SELECT %(outcomes)s::jsonb AS m, %(ids)s::bigint[] AS ids, %(retries)s::bigint[] AS retries
), finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY((SELECT ids FROM batch)::bigint[]) AND j.status = (SELECT 'running'::text)
      -- The batch's slot rows, locked in key order before any job moves (migration 0007),
      -- unless every job came from the claim that takes only jobs without keys (`keyed`).
      AND (NOT %(keyed)s::boolean
           OR (SELECT {schema}.concurrency_lock_slots((SELECT ids FROM batch))) IS NOT NULL)
      AND j.attempt = ((SELECT m FROM batch) -> j.id::text ->> 'attempt')::integer
      AND j.worker_id = ((SELECT m FROM batch) -> j.id::text ->> 'worker_id')::bigint
      AND ((SELECT m FROM batch) -> j.id::text ->> 'status' IN ('succeeded', 'failed', 'cancelled')
           OR ((SELECT m FROM batch) -> j.id::text ->> 'status' = 'retry'
               AND j.cancel_requested_at IS NOT NULL))
    RETURNING j.id, j.queue, j.task, j.args,
              CASE WHEN (SELECT m FROM batch) -> j.id::text ->> 'status' = 'retry' THEN 'cancelled'
                   ELSE (SELECT m FROM batch) -> j.id::text ->> 'status' END AS status,
              j.priority, j.attempt, j.max_attempts,
              j.run_at, j.created_at, j.started_at,
              coalesce(j.started_at + make_interval(
                           secs => ((SELECT m FROM batch) -> j.id::text ->> 'duration')::float8),
                       coalesce(%(now)s::timestamptz, now())) AS finished_at, j.worker_id,
              CASE WHEN nullif((SELECT m FROM batch) -> j.id::text -> 'error', 'null') IS NULL
                   THEN j.errors
                   ELSE j.errors || jsonb_build_array((SELECT m FROM batch) -> j.id::text -> 'error')
              END AS errors,
              nullif((SELECT m FROM batch) -> j.id::text -> 'result', 'null') AS result,
              j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key, j.workflow_id,
              -- The handler's last progress report, when the worker had not written it yet.
              coalesce(nullif((SELECT m FROM batch) -> j.id::text -> 'progress', 'null'),
                       j.progress) AS progress,
              j.tags, j.limit_keys, j.fairness_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key, workflow_id, progress, tags, limit_keys, fairness_key)
    SELECT * FROM finished
    WHERE %(keep_history)s
    RETURNING id
), retried AS (
    -- Retries go back to their queues in a function called only for a batch that has some
    -- (migration 0037): an UPDATE here would open every index of jobs for every batch.
    SELECT {schema}.retry_outcomes(b.m, b.retries, %(now)s::timestamptz) AS r
    FROM batch AS b WHERE cardinality(b.retries) > 0
), settled AS (
    -- Jobs of a workflow release or cancel what waits for them (migration 0010); a batch
    -- without any calls nothing.
    SELECT {schema}.workflow_settle(array_agg(f.id), array_agg(f.status), array_agg(f.result),
                                    %(keep_history)s) AS n
    FROM finished AS f WHERE f.workflow_id IS NOT NULL HAVING count(*) > 0
), told AS (
    -- Those finished jobs someone waits for tell their waiters at commit (migration 0027).
    SELECT {schema}.notify_waiters(ARRAY(SELECT f.id FROM finished AS f)) AS n
)
SELECT (SELECT count(*) FROM finished) AS finished,
       coalesce((SELECT (r).retried FROM retried), 0) AS retried,
       (SELECT count(*) FROM archived) AS archived,
       coalesce((SELECT (r).woken FROM retried), 0) AS woken,
       (SELECT n FROM settled) AS settled,
       (SELECT n FROM told) AS told;

-- name: job_release_many
-- Puts a stopping worker's unfinished jobs back to queued without spending an attempt: the
-- job did not fail, its worker went away. Guarded like job_finish_many. Wakes the workers with
-- the lowest (priority, id) put back per queue, since claim hints have passed them.
-- By primary key only, like job_finish_many: `(SELECT 'running')` is a value the planner
-- does not know, so the guard cannot select jobs_running_idx (see there).
WITH released AS (
    UPDATE {schema}.jobs
    SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
    WHERE id = ANY(%(ids)s::bigint[]) AND status = (SELECT 'running'::text)
      AND worker_id = %(worker_id)s
      AND (SELECT {schema}.concurrency_lock_slots(%(ids)s::bigint[])) IS NOT NULL
    RETURNING id, queue, priority
)
SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS woken
FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM released
      ORDER BY queue, priority, id) AS l;

-- name: job_find_stranded
-- Running jobs whose worker missed its heartbeats for longer than the lease. Locks them
-- (skipping rows a live completion holds) for the rescuing transaction. A worker that
-- heartbeats is never matched, however long its jobs run. It starts from the silent workers
-- and reads only their entries of jobs_running_idx: while a long transaction holds the
-- horizon, that index keeps an entry for every job that ever ran, and walking all of it grows
-- with every job run meanwhile. The LIMIT inside LATERAL keeps
-- it a lookup per silent worker: as a plain join, the planner hashed every running entry. It
-- has no ORDER BY: ordered by id, the generic plan walked jobs_pkey and filtered by worker.
SELECT j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
FROM {schema}.workers AS w
CROSS JOIN LATERAL (
    SELECT r.id, r.task, r.args, r.priority, r.attempt, r.max_attempts, r.queue, r.worker_id
    FROM {schema}.jobs AS r
    WHERE r.worker_id = w.id AND r.status = 'running'
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS j
WHERE w.heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease)s)
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_find_orphaned
-- Running jobs whose worker row is gone: a worker presumed dead (its row removed) that claimed
-- before its next heartbeat put the row back, then died. Looked up per removed worker
-- (workers_removed, migration 0042): one descent into jobs_running_idx each, so a long
-- transaction's dead entries of the live workers' jobs are never walked.
SELECT j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
FROM {schema}.workers_removed AS r
CROSS JOIN LATERAL (
    SELECT o.id, o.task, o.args, o.priority, o.attempt, o.max_attempts, o.queue, o.worker_id
    FROM {schema}.jobs AS o
    WHERE o.worker_id = r.id AND o.status = 'running'
      AND NOT EXISTS (SELECT 1 FROM {schema}.workers AS w WHERE w.id = r.id)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS j
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_find_of_workers
-- The running jobs of these workers, found dead by their ended session and removed in this
-- transaction (worker_delete_gone), locked for it, skipping rows a completion holds: a
-- lookup per worker in jobs_running_idx, as in job_find_stranded.
SELECT j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
FROM unnest(%(workers)s::bigint[]) AS w (id)
CROSS JOIN LATERAL (
    SELECT r.id, r.task, r.args, r.priority, r.attempt, r.max_attempts, r.queue, r.worker_id
    FROM {schema}.jobs AS r
    WHERE r.worker_id = w.id AND r.status = 'running'
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS j
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_claim_atomic
-- Claims one atomic job of the given tasks inside the caller's open transaction. Other workers
-- still see it queued but locked, so SKIP LOCKED passes over it and the rescuer ignores it; a
-- crash or rollback releases it at once, with its attempt uncounted. Paused queues are left
-- out here, in the statement: an atomic lane has no listener of its own, and its claims are
-- few (one job each, in the job's own transaction).
WITH picked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s::text[])
      AND status = 'queued'
      AND atomic
      AND task = ANY(%(tasks)s::text[])
      AND queue <> ALL (ARRAY(SELECT qp.queue FROM {schema}.queue_pauses AS qp))
    ORDER BY priority, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = 'running',
    attempt = j.attempt + 1,
    started_at = coalesce(%(now)s::timestamptz, now()),
    worker_id = %(worker_id)s
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
          j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited;

-- name: job_atomic_retake
-- Takes back an atomic job whose transaction the database refused to commit (a deferred
-- constraint its handler's writes broke, a serialization failure), so that its failure is
-- recorded and spends the attempt, as any other failure does, instead of the job being
-- claimed again for nothing forever. The rollback left the job as it was: queued with the
-- attempt uncounted, or, when one of its steps' segments had committed, running for this
-- worker. Another lane that claimed it meanwhile keeps it (no row).
UPDATE {schema}.jobs AS j
SET status = 'running',
    attempt = %(attempt)s,
    started_at = CASE WHEN j.status = 'queued' THEN now() ELSE j.started_at END,
    worker_id = %(worker_id)s
WHERE j.id = %(job_id)s
  AND ((j.status = 'queued' AND j.attempt = %(attempt)s - 1)
       OR (j.status = 'running' AND j.worker_id = %(worker_id)s AND j.attempt = %(attempt)s))
RETURNING j.id;

-- name: job_release_orphans
-- After the claim connection broke, puts back running jobs this worker holds but never
-- received (the claim committed, its reply was lost). Claims only run on that connection, one
-- at a time, so every job of ours not in `known` is such an orphan; its attempt is returned.
-- Wakes the workers with the lowest (priority, id) put back per queue. Like a batch of
-- outcomes, it locks those jobs' rows and then their slots in key order before any job moves.
WITH released AS (
    UPDATE {schema}.jobs
    SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
    WHERE worker_id = %(worker_id)s AND status = 'running'
      AND NOT (id = ANY(%(known)s::bigint[]))
      AND (SELECT {schema}.concurrency_lock_slots(ARRAY(
               SELECT o.id FROM {schema}.jobs AS o
               WHERE o.worker_id = %(worker_id)s AND o.status = 'running'
                 AND NOT (o.id = ANY(%(known)s::bigint[]))))) IS NOT NULL
    RETURNING id, queue, priority
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
    FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM released
          ORDER BY queue, priority, id) AS l
)
SELECT id FROM released WHERE (SELECT n FROM woken) IS NOT NULL;

-- name: job_fail_out_of_range
-- Fails the scheduled jobs of these queues whose run_at is after year 9999 (infinity
-- included): Python cannot represent such a time, no worker would ever run the job, and only
-- a write behind the API's back can store one, since enqueue refuses it. Each moves to history
-- as failed, with an error that says why. A range scan at the top of jobs_scheduled_idx per
-- queue, which finds nothing on a healthy queue; SKIP LOCKED lets workers run it at once.
WITH picked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s::text[])
      AND status = 'scheduled'
      AND run_at >= '10000-01-01 00:00:00+00'::timestamptz
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.jobs AS j
    USING picked AS p
    WHERE j.id = p.id AND j.status = 'scheduled'
    RETURNING j.id, j.queue, j.task, j.args, 'failed'::text AS status, j.priority, j.attempt,
              j.max_attempts, j.run_at, j.created_at, j.started_at,
              coalesce(%(now)s::timestamptz, now()) AS finished_at, j.worker_id,
              j.errors || jsonb_build_array(jsonb_build_object(
                  'attempt', j.attempt,
                  'at', coalesce(%(now)s::timestamptz, now()),
                  'kind', 'out_of_range',
                  'error', 'run_at ' || j.run_at::text || ' is after year 9999, later than '
                           || 'pgqueue can represent: enqueue the job again with an earlier time',
                  'traceback', '')) AS errors,
              NULL::jsonb AS result, j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key,
              j.workflow_id, j.progress, j.tags, j.limit_keys, j.fairness_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key, workflow_id, progress, tags, limit_keys, fairness_key)
    SELECT * FROM gone
    WHERE %(keep_history)s
    RETURNING id
), settled AS (
    SELECT {schema}.workflow_settle(array_agg(g.id), array_agg(g.status), array_agg(g.result),
                                    %(keep_history)s) AS n
    FROM gone AS g WHERE g.workflow_id IS NOT NULL HAVING count(*) > 0
)
SELECT count(*) AS failed, (SELECT count(*) FROM archived) AS archived,
       (SELECT n FROM settled) AS settled
FROM gone;
