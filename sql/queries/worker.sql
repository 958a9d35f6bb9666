-- Statements a worker runs on its own connections, in autocommit: each is its own transaction.

-- name: worker_register
-- Records a starting worker; its id guards every write it makes to a job.
INSERT INTO {schema}.workers (name, hostname, pid, queues, concurrency)
VALUES (%(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
RETURNING id;

-- name: worker_heartbeat
-- Proves the worker alive: one row per worker, never one per job. If the rescuer removed the
-- row (the worker was presumed dead), it is put back under the same id and `revived` is true:
-- the jobs it held were rescued, and their late outcomes are refused by the completion guard.
INSERT INTO {schema}.workers AS w (id, name, hostname, pid, queues, concurrency)
OVERRIDING SYSTEM VALUE
VALUES (%(worker_id)s, %(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
RETURNING (xmax = 0) AS revived;

-- name: worker_list
-- The workers with a row, newest first, each with its running jobs (a lookup per worker in
-- jobs_running_idx) and the age of its last heartbeat by the database's clock. A worker
-- whose heartbeat is older than its lease is dead and about to be rescued.
SELECT w.id, w.name, w.hostname, w.pid, w.queues, w.concurrency, w.started_at, w.heartbeat_at,
       coalesce(%(now)s::timestamptz, now()) - w.heartbeat_at AS silent_for,
       (SELECT count(*) FROM {schema}.jobs AS j
        WHERE j.worker_id = w.id AND j.status = 'running') AS running
FROM {schema}.workers AS w
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: worker_deregister
-- Removes a worker that stopped cleanly, after its jobs were finished or put back.
DELETE FROM {schema}.workers WHERE id = %(worker_id)s;

-- name: session_set_async_commit
-- Makes this session's commits return before their WAL is flushed. Run on the lease-claim
-- connection only (pgqueue/worker.py, _claim_session): a claim lost in a server crash leaves
-- its job queued, or running for a worker the rescuer then finds dead, which a crash causes
-- anyway; and the outcome's commit, synchronous, flushes the claim's WAL with its own. Never
-- on an atomic lane, whose commit carries the handler's writes.
SELECT set_config('synchronous_commit', 'off', false);

-- name: session_prefer_indexes
-- Keeps the planner off sequential scans and JIT in the worker's own sessions (claim and
-- completer), whose statements are all written for index access (test_claim_plan.py,
-- test_finish_plan.py) and return quickly. A prepared statement keeps the generic plan
-- it got when the table was small, and without fresh statistics (autovacuum off, or the first
-- minute of a new table) nothing replans it: the outcome writes kept a sequential scan of
-- jobs planned while it was nearly empty, and once a held horizon had bloated the heap each
-- write read all of it. Tables with no usable index (the small concurrency tables) are
-- still scanned: the setting only makes that path the last resort. JIT compiles a statement
-- whose estimate passes jit_above_cost, which stale estimates on a bloated table can do, and
-- the compiling alone costs far more than a claim. Never set on an atomic lane:
-- that session runs the handler's own statements.
SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false);

-- name: job_claim
-- Claims up to %(limit)s queued jobs of one queue in (priority, id) order, skipping rows other
-- workers hold, between two positions. The row comparisons are the start and stop bounds of
-- an index range scan on jobs_claim_idx, so dead entries outside the range are never visited
-- even while a long transaction keeps them. The floor (-32768, 0) and the ceiling (32767, max bigint) claim everything.
-- A row updated concurrently is re-checked against status = 'queued' when its lock is taken,
-- so a job is never claimed twice.
-- Jobs with a concurrency key are admitted by one guarded upsert of their key's slot row, in
-- key order (so two claims never deadlock on slots): SET reads the row's latest version under
-- its lock, so running never exceeds the limit whatever the number of claimers; `admitted`
-- says how many got in. Picked jobs beyond that are parked ('waiting', out of the claim
-- index) and returned with parked = true so the hint moves past them; a saturated key's other
-- queued jobs are parked too, up to 100,000 per key per claim, by concurrency_park (migration
-- 0006), so no later claim walks them (fairness).
-- Jobs without a key only pass through empty CTEs (bench/tenants.py measures that).
WITH picked AS (
    SELECT id, priority, concurrency_key AS key
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND NOT atomic
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
      AND (priority, id) < (%(before_priority)s::smallint, %(before_id)s::bigint)
    ORDER BY priority, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), demand AS (
    -- The key's own limit, else the default ('*'), else NULL: unlimited (least() and
    -- greatest() ignore NULL). Joins, not a function call per key, which cost more per claim
    -- as keys grow.
    SELECT p.key, count(*)::integer AS n, coalesce(l.max_running, d.max_running) AS lim
    FROM picked AS p
    LEFT JOIN {schema}.concurrency_limits AS l ON l.key = p.key
    LEFT JOIN {schema}.concurrency_limits AS d ON d.key = '*'
    WHERE p.key IS NOT NULL
    GROUP BY p.key, l.max_running, d.max_running
), slot AS (
    INSERT INTO {schema}.concurrency_slots AS s (key, running, admitted, max_running)
    SELECT key, least(n, lim), least(n, lim), lim FROM demand ORDER BY key
    ON CONFLICT (key) DO UPDATE
    SET admitted = greatest(least(excluded.admitted, excluded.max_running - s.running), 0),
        running = s.running + greatest(least(excluded.admitted,
                                             excluded.max_running - s.running), 0),
        max_running = excluded.max_running
    RETURNING s.key, s.admitted
), ranked AS (
    SELECT p.id, p.key,
           row_number() OVER (PARTITION BY p.key ORDER BY p.priority, p.id) <= s.admitted AS fits
    FROM picked AS p
    JOIN slot AS s ON s.key = p.key
), parked AS (
    UPDATE {schema}.jobs AS j
    SET status = 'waiting'
    WHERE j.id = ANY(ARRAY(SELECT id FROM ranked WHERE NOT fits))
    RETURNING j.id, j.priority
), parked_rest AS (
    -- In a function (migration 0006), so the planner does not cost every claim for parking
    -- whole backlogs: that cost made PostgreSQL JIT-compile the claim (100+ ms).
    SELECT {schema}.concurrency_park(ARRAY(SELECT DISTINCT key FROM ranked WHERE NOT fits),
                                     ARRAY(SELECT id FROM picked)) AS n
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        started_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = %(worker_id)s
    -- = ANY(ARRAY(...)) here and in parked: primary-key lookups in a generic plan too, where
    -- a join with picked (estimated at a tenth of the queue) became a sequential scan of jobs.
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked WHERE key IS NULL
                           UNION ALL SELECT id FROM ranked WHERE fits))
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked
FROM claimed
UNION ALL
SELECT id, NULL, NULL, priority, NULL, NULL, NULL, NULL, true
FROM parked
WHERE (SELECT n FROM parked_rest) IS NOT NULL;  -- a plain CTE runs only where it is read

-- name: job_claim_unkeyed
-- job_claim for a queue whose jobs carry no concurrency key, at the cost of the claim before
-- keys existed (bench/tenants.py): same range scan, same guard. If a picked job has a key it
-- claims nothing and returns one row with parked = NULL: the worker switches that queue to
-- job_claim and claims again (the locks are released at once, this being its own statement).
WITH picked AS (
    SELECT id, concurrency_key IS NOT NULL AS keyed
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
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE (SELECT found FROM keyed);

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
    UPDATE {schema}.jobs AS j SET status = 'queued'
    FROM due WHERE j.id = due.id
    RETURNING j.id, j.queue, j.priority
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
    FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM promoted
          ORDER BY queue, priority, id) AS l
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT extract(epoch FROM min(run_at))::float8
               - extract(epoch FROM coalesce(%(now)s::timestamptz, now()))::float8
        FROM {schema}.jobs
        WHERE queue = ANY(%(queues)s::text[]) AND status = 'scheduled'
          AND run_at > coalesce(%(now)s::timestamptz, now())) AS next_due_in,
       (SELECT n FROM woken) AS woken;

-- name: job_finish_many
-- Writes a batch of outcomes in one statement. Finished jobs (succeeded, failed, cancelled)
-- leave the hot table and, unless history is off, land in job_history in the same statement;
-- retried jobs go back to scheduled (or queued when due now) with the error appended; those
-- queued now wake the workers with their lowest (priority, id) per queue (see job_insert).
-- Guard: a row moves only while it is still running this attempt for the worker that claimed it
-- (each outcome names it: the worker itself, or the rescuer acting for a dead one), so a late or
-- duplicate write cannot move a job that was put back, rescued or finished elsewhere.
-- A retry of a job whose cancellation was requested ends it as cancelled instead.
-- Each job row finds its outcome by key in one jsonb object (`batch.m`, an InitPlan computed
-- once), never by a join with the outcomes: whatever the statistics say, a write costs
-- O(batch). A join was planned as a nested loop over every outcome for every row (quadratic),
-- or with stale statistics (a table analysed while empty) as a walk of every running row once
-- per outcome.
-- The running guard compares with `(SELECT 'running'::text)`, a value the planner does not
-- know, rather than a constant, so it cannot select the partial index jobs_running_idx: while
-- a long transaction holds the horizon that index keeps an entry for every job that ever ran,
-- and a batch walking it slows with every job run meanwhile (test_finish_plan.py).
-- `retries` holds only the retried ids: in a batch without retries the retried branch reads
-- no row (it used to read every row of the batch).
WITH batch AS MATERIALIZED (
    SELECT jsonb_object_agg(o ->> 'id', o) AS m, array_agg((o ->> 'id')::bigint) AS ids,
           coalesce(array_agg((o ->> 'id')::bigint) FILTER (WHERE o ->> 'status' = 'retry'),
                    ARRAY[]::bigint[]) AS retries
    FROM jsonb_array_elements(%(outcomes)s::jsonb) AS o
), finished AS (
    DELETE FROM {schema}.jobs AS j
    WHERE j.id = ANY((SELECT ids FROM batch)::bigint[]) AND j.status = (SELECT 'running'::text)
      -- The batch's slot rows, locked in key order before any job moves (migration 0007).
      AND (SELECT {schema}.concurrency_lock_slots((SELECT ids FROM batch))) IS NOT NULL
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
              j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key)
    SELECT * FROM finished
    WHERE %(keep_history)s
    RETURNING id
), retried AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN ((SELECT m FROM batch) -> j.id::text ->> 'retry_in')::float8 > 0
                      THEN 'scheduled' ELSE 'queued' END,
        run_at = coalesce(%(now)s::timestamptz, now())
                 + make_interval(secs => ((SELECT m FROM batch) -> j.id::text ->> 'retry_in')::float8),
        worker_id = NULL,
        errors = j.errors
                 || jsonb_build_array(nullif((SELECT m FROM batch) -> j.id::text -> 'error', 'null'))
    WHERE j.id = ANY((SELECT retries FROM batch)::bigint[]) AND j.status = (SELECT 'running'::text)
      AND j.attempt = ((SELECT m FROM batch) -> j.id::text ->> 'attempt')::integer
      AND j.worker_id = ((SELECT m FROM batch) -> j.id::text ->> 'worker_id')::bigint
      AND (SELECT m FROM batch) -> j.id::text ->> 'status' = 'retry'
      AND j.cancel_requested_at IS NULL
    RETURNING j.id, j.queue, j.priority, j.status
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
    FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM retried
          WHERE status = 'queued' ORDER BY queue, priority, id) AS l
)
SELECT (SELECT count(*) FROM finished) AS finished,
       (SELECT count(*) FROM retried) AS retried,
       (SELECT count(*) FROM archived) AS archived,
       (SELECT n FROM woken) AS woken;

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

-- name: worker_listen
-- Subscribes to the schema's wake-up channel (pgqueue/wakeup.py reads its payloads).
LISTEN {channel};

-- name: worker_rescue_lock
-- Lets one rescuer act at a time across all workers of the schema; released at commit.
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.rescue'), hashtext(%(schema)s));

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
-- before its next heartbeat put the row back, then died. Rare, and a walk over every running
-- entry, so the rescuer runs it on its first pass and then every ORPHAN_PASSES passes.
SELECT j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id
FROM {schema}.jobs AS j
WHERE j.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM {schema}.workers AS w WHERE w.id = j.worker_id)
ORDER BY j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED;

-- name: worker_delete_dead
-- Removes workers silent for longer than the lease once none of their jobs is still running.
DELETE FROM {schema}.workers AS w
WHERE w.heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease)s)
  AND NOT EXISTS (
      SELECT 1 FROM {schema}.jobs AS j WHERE j.worker_id = w.id AND j.status = 'running'
  );

-- name: job_notify_dead
-- Tells listeners on the schema's dead-job channel that a job was abandoned; sent at commit.
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: job_claim_atomic
-- Claims one atomic job of the given tasks inside the caller's open transaction. Other workers
-- still see it queued but locked, so SKIP LOCKED passes over it and the rescuer ignores it; a
-- crash or rollback releases it at once, with its attempt uncounted.
WITH picked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s::text[])
      AND status = 'queued'
      AND atomic
      AND task = ANY(%(tasks)s::text[])
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
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id;

-- name: transaction_bound_idle
-- Server-side backstop for an atomic job's transaction: if its worker hangs while idle in the
-- transaction past this many milliseconds, PostgreSQL ends the session and the job is freed.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true);

-- name: job_release_orphans
-- After the claim connection broke, puts back running jobs this worker holds but never
-- received (the claim committed, its reply was lost). Claims only run on that connection, one
-- at a time, so every job of ours not in `known` is such an orphan; its attempt is returned.
-- Wakes the workers with the lowest (priority, id) put back per queue.
WITH released AS (
    UPDATE {schema}.jobs
    SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
    WHERE worker_id = %(worker_id)s AND status = 'running'
      AND NOT (id = ANY(%(known)s::bigint[]))
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
              NULL::jsonb AS result, j.dedupe_key, j.retry_of, j.atomic, j.concurrency_key
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
         concurrency_key)
    SELECT * FROM gone
    WHERE %(keep_history)s
    RETURNING id
)
SELECT count(*) AS failed, (SELECT count(*) FROM archived) AS archived FROM gone;
