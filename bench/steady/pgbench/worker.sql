-- The steady bound's worker: pgqueue's lifecycle in SQL alone (bench/throughput/pgbench/
-- lease_finish.sql): lease up to :batch queued jobs, then finish them into history. With
-- nothing to lease it sleeps 1 ms, as a poll, where pgqueue's worker waits for a wake-up.
\set worker random(1, 1000000000)
WITH leased AS (
    UPDATE jobs AS j
    SET status = 'running', attempt = j.attempt + 1, started_at = now(), worker_id = :worker
    WHERE j.id = ANY(ARRAY(
        SELECT id FROM jobs
        WHERE queue = 'default' AND status = 'queued' AND NOT atomic
        ORDER BY priority, id
        LIMIT :batch
        FOR UPDATE SKIP LOCKED))
    RETURNING 1
)
SELECT count(*) AS leased FROM leased \gset
\if :leased = 0
\sleep 1 ms
\else
WITH finished AS (
    DELETE FROM jobs AS j
    WHERE j.worker_id = :worker AND j.status = 'running'
    RETURNING j.id, j.queue, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.run_at,
              j.created_at, j.started_at, j.worker_id, j.errors, j.dedupe_key, j.retry_of,
              j.atomic, j.concurrency_key
)
INSERT INTO job_history
    (id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
     started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
     concurrency_key)
SELECT id, queue, task, args, 'succeeded', priority, attempt, max_attempts, run_at, created_at,
       started_at, now(), worker_id, errors, NULL, dedupe_key, retry_of, atomic, concurrency_key
FROM finished;
\endif
