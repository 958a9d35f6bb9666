-- Statements a worker runs on its own connections, in autocommit: each is its own transaction.

-- name: worker_register
-- Records a starting worker; its id guards every write it makes to a job.
INSERT INTO {schema}.workers (name, hostname, pid, queues, concurrency)
VALUES (%(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
RETURNING id;

-- name: worker_heartbeat
-- Proves the worker alive. One row per worker, never one per job.
UPDATE {schema}.workers SET heartbeat_at = now() WHERE id = %(worker_id)s;

-- name: worker_deregister
-- Removes a worker that stopped cleanly, after its jobs were finished or put back.
DELETE FROM {schema}.workers WHERE id = %(worker_id)s;

-- name: job_claim
-- Claims up to %(limit)s queued jobs of one queue in (priority, id) order, skipping rows other
-- workers hold. The row comparison against the hint is an index start bound on jobs_claim_idx,
-- so dead entries below the hint are never visited (seed 002). The floor hint (-32768, 0)
-- claims from the start. A row updated concurrently is re-checked against status = 'queued'
-- when its lock is taken, so a job is never claimed twice.
WITH picked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND (priority, id) > (%(after_priority)s::smallint, %(after_id)s::bigint)
    ORDER BY priority, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS j
SET status = 'running',
    attempt = j.attempt + 1,
    started_at = coalesce(%(now)s::timestamptz, now()),
    worker_id = %(worker_id)s
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue;

-- name: job_promote_due
-- Moves due scheduled jobs of these queues to queued, oldest first, in a bounded batch, and
-- returns the next run_at still ahead so the worker can sleep until then. SKIP LOCKED lets
-- several workers promote at once without waiting on each other.
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
    RETURNING j.id
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT min(run_at) FROM {schema}.jobs
        WHERE queue = ANY(%(queues)s::text[]) AND status = 'scheduled'
          AND run_at > coalesce(%(now)s::timestamptz, now())) AS next_run_at;

-- name: job_finish_many
-- Writes a batch of outcomes in one statement. Finished jobs (succeeded, failed, cancelled)
-- leave the hot table and, unless history is off, land in job_history in the same statement;
-- retried jobs go back to scheduled (or queued when due now) with the error appended.
-- Guard: a row moves only while it is still running this attempt for this worker, so a late or
-- duplicate write cannot move a job that was put back, rescued or finished elsewhere.
WITH outcome AS (
    SELECT *
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
         AS o(id bigint, attempt integer, status text, error jsonb, result jsonb,
              duration double precision, retry_in double precision)
), finished AS (
    DELETE FROM {schema}.jobs AS j
    USING outcome AS o
    WHERE j.id = o.id AND j.attempt = o.attempt
      AND j.status = 'running' AND j.worker_id = %(worker_id)s
      AND o.status IN ('succeeded', 'failed', 'cancelled')
    RETURNING j.id, j.queue, j.task, j.args, o.status, j.priority, j.attempt, j.max_attempts,
              j.run_at, j.created_at, j.started_at,
              j.started_at + make_interval(secs => o.duration) AS finished_at, j.worker_id,
              CASE WHEN o.error IS NULL THEN j.errors
                   ELSE j.errors || jsonb_build_array(o.error) END AS errors,
              o.result
), archived AS (
    INSERT INTO {schema}.job_history
        (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
         started_at, finished_at, worker_id, errors, result)
    SELECT * FROM finished
    WHERE %(keep_history)s
    RETURNING id
), retried AS (
    UPDATE {schema}.jobs AS j
    SET status = CASE WHEN o.retry_in > 0 THEN 'scheduled' ELSE 'queued' END,
        run_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => o.retry_in),
        worker_id = NULL,
        errors = j.errors || jsonb_build_array(o.error)
    FROM outcome AS o
    WHERE j.id = o.id AND j.attempt = o.attempt
      AND j.status = 'running' AND j.worker_id = %(worker_id)s
      AND o.status = 'retry'
    RETURNING j.id
)
SELECT (SELECT count(*) FROM finished) AS finished,
       (SELECT count(*) FROM retried) AS retried,
       (SELECT count(*) FROM archived) AS archived;

-- name: job_release_many
-- Puts a stopping worker's unfinished jobs back to queued without spending an attempt: the
-- job did not fail, its worker went away. Guarded like job_finish_many.
UPDATE {schema}.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
WHERE id = ANY(%(ids)s::bigint[]) AND status = 'running' AND worker_id = %(worker_id)s;

-- name: worker_listen
-- Subscribes to the schema's wake-up channel; the payload of each notification is a queue name.
LISTEN {channel};
