-- pgqueue on a Citus cluster (pgqueue/citus/): the layout `pgqueue migrate --citus` adds on
-- the coordinator after the migrations, and the statements of the Citus enqueue and worker.
-- Jobs and their history are distributed by their `shard` column, colocated, so a job and
-- the application's rows with the same distribution value live on one node; every statement
-- on them names one shard, so that Citus routes it to that node as a single task. Those a
-- worker runs per job name their tables {jobs}, {job_history} and {queue_pauses}, and their
-- shard {in_shard}: through the coordinator, the schema's tables and `shard = %(shard)s`; on
-- a node, one shard's own tables (citus_shard_tables) and every row in them, a plain
-- PostgreSQL statement with no distributed planning.

-- name: citus_version
-- The citus extension's version in this database, no row without it.
SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'citus';

-- name: citus_laid_out
-- Whether the schema's jobs table is distributed (the layout below ran).
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_dist_partition
    WHERE logicalrelid = to_regclass(quote_ident({schema_name}) || '.jobs')
) AS laid_out;

-- name: citus_lay_out
-- Lays the migrated schema out for the cluster, in one transaction. Citus distributes no
-- table with triggers, and takes unique indexes only with the distribution column in them:
-- the jobs triggers go (concurrency slots and fair shares are refused on Citus), the primary
-- keys and unique indexes take the shard first, and a plain index keeps lookups by id alone.
-- Rows already there take the shard a new job would (pgqueue/citus/queue.py: the fairness
-- key, else the concurrency key, else the queue). The definitions a claim may read on a node
-- become reference tables; the rest (the task declarations, whose upsert stamps now(), the
-- workers, periodic ticks, the outbox, signals, steps) stay on the coordinator.
DROP TRIGGER IF EXISTS jobs_concurrency_release_on_delete ON {schema}.jobs;
DROP TRIGGER IF EXISTS jobs_concurrency_release_on_update ON {schema}.jobs;
DROP TRIGGER IF EXISTS jobs_fairness_catch_up_on_insert ON {schema}.jobs;
DROP TRIGGER IF EXISTS jobs_fairness_catch_up_on_requeue ON {schema}.jobs;
DROP TRIGGER IF EXISTS jobs_take_xid ON {schema}.jobs;
ALTER TABLE {schema}.jobs ADD COLUMN shard text;
UPDATE {schema}.jobs SET shard = coalesce(fairness_key, concurrency_key, queue);
ALTER TABLE {schema}.jobs ALTER COLUMN shard SET NOT NULL,
    ADD CONSTRAINT shard_key_valid CHECK (char_length(shard) BETWEEN 1 AND 255),
    DROP CONSTRAINT jobs_pkey,
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (shard, id);
CREATE INDEX jobs_id_idx ON {schema}.jobs (id);
DROP INDEX {schema}.jobs_dedupe_key_idx;
CREATE UNIQUE INDEX jobs_dedupe_key_idx ON {schema}.jobs (shard, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
DROP INDEX {schema}.jobs_retry_of_idx;
CREATE UNIQUE INDEX jobs_retry_of_idx ON {schema}.jobs (shard, retry_of) WHERE retry_of IS NOT NULL;
CREATE INDEX jobs_shard_claim_idx ON {schema}.jobs (shard, queue, priority, id)
    WHERE status = 'queued';
CREATE INDEX jobs_shard_scheduled_idx ON {schema}.jobs (shard, run_at) WHERE status = 'scheduled';
ALTER TABLE {schema}.job_history ADD COLUMN shard text;
UPDATE {schema}.job_history SET shard = coalesce(fairness_key, concurrency_key, queue);
ALTER TABLE {schema}.job_history ALTER COLUMN shard SET NOT NULL;
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT i.inhrelid::regclass FROM pg_inherits AS i
        WHERE i.inhparent = to_regclass(quote_ident({schema_name}) || '.job_history')
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I, ADD PRIMARY KEY (shard, id)',
                       part, (SELECT relname FROM pg_class WHERE oid = part) || '_pkey');
    END LOOP;
END
$$;
CREATE INDEX job_history_id_idx ON {schema}.job_history (id);
-- Enqueue and signals in SQL insert without a shard: on Citus they refuse, saying so.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text, args jsonb DEFAULT '{{}}'::jsonb, queue text DEFAULT NULL::text,
    priority integer DEFAULT NULL::integer, run_at timestamptz DEFAULT NULL::timestamptz,
    max_attempts integer DEFAULT NULL::integer, concurrency_key text DEFAULT NULL::text,
    tags text[] DEFAULT NULL::text[], dedupe_key text DEFAULT NULL::text,
    dedupe_window interval DEFAULT NULL::interval) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue: enqueue() in SQL is not available on Citus: enqueue with '
                    'pgqueue.citus.CitusQueue, which gives each job its shard'
        USING ERRCODE = 'feature_not_supported';
END
$$;
CREATE OR REPLACE FUNCTION {schema}.enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue: enqueue_many() in SQL is not available on Citus: enqueue with '
                    'pgqueue.citus.CitusQueue, which gives each job its shard'
        USING ERRCODE = 'feature_not_supported';
END
$$;
CREATE OR REPLACE FUNCTION {schema}.signal(key text, payload jsonb DEFAULT 'null'::jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pgqueue: signals are not available on Citus'
        USING ERRCODE = 'feature_not_supported';
END
$$;
SELECT create_distributed_table(quote_ident({schema_name}) || '.jobs', 'shard');
SELECT create_distributed_table(quote_ident({schema_name}) || '.job_history', 'shard',
                                colocate_with => quote_ident({schema_name}) || '.jobs');
SELECT create_reference_table(quote_ident({schema_name}) || '.' || t)
FROM unnest(ARRAY['queue_pauses', 'rate_limits', 'job_rate_limits', 'concurrency_limits',
                  'fairness_weights']) AS t;

-- name: citus_job_insert
-- One job on its shard, in the caller's transaction: a single-row VALUES, which Citus routes
-- to the shard's node, so a transaction whose other rows share the job's distribution value
-- commits there alone, without two-phase commit. No NOTIFY: a transaction that reaches two
-- nodes commits by two-phase commit, which a NOTIFY would make fail. Workers poll instead.
-- A job with a dedupe key is not inserted while its shard holds a live job with that key:
-- no row comes back. ON CONFLICT waits for an uncommitted job with the key; once that one
-- commits, the caller finds it with citus_job_find_dedupe, whose newer snapshot sees it.
INSERT INTO {schema}.jobs AS j
    (shard, queue, task, args, priority, max_attempts, run_at, concurrency_key, tags,
     trace_context, dedupe_key, status)
VALUES (%(shard)s::text, %(queue)s::text, %(task)s::text, %(args)s::jsonb,
        %(priority)s::smallint, %(max_attempts)s::integer,
        coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => coalesce(%(delay)s::float8, 0))),
        %(concurrency_key)s::text, %(tags)s::text[], %(trace_context)s::jsonb,
        %(dedupe_key)s::text,
        CASE WHEN coalesce(%(run_at)s::timestamptz,
                           now() + make_interval(secs => coalesce(%(delay)s::float8, 0))) > now()
             THEN 'scheduled' ELSE 'queued' END)
ON CONFLICT (shard, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING j.id;

-- name: citus_job_find_dedupe
-- The job a dedupe key resolves to on one shard: the live job with the key, else, given a
-- window, the one with the key that finished last within it; no row when there is neither.
-- The unique index allows one live job per shard and key; the same key on another shard is
-- another job.
SELECT found.id
FROM ((SELECT j.id, 0 AS rank FROM {schema}.jobs AS j
       WHERE j.shard = %(shard)s::text AND j.dedupe_key = %(dedupe_key)s::text
       LIMIT 1)
      UNION ALL
      (SELECT h.id, 1 AS rank FROM {schema}.job_history AS h
       WHERE h.shard = %(shard)s::text AND h.dedupe_key = %(dedupe_key)s::text
         AND %(dedupe_window)s::float8 IS NOT NULL
         AND h.finished_at >= coalesce(%(now)s::timestamptz, now())
                              - make_interval(secs => %(dedupe_window)s::float8)
       ORDER BY h.finished_at DESC
       LIMIT 1)) AS found
ORDER BY found.rank
LIMIT 1;

-- name: citus_job_dedupe_recheck
-- Whether a job with the dedupe key finished within the window on the shard, read after
-- citus_job_insert created one: a job committed after citus_job_find_dedupe's snapshot may
-- have finished before the insert checked for a conflict, which then found none. The caller
-- rolls the insert back to its savepoint and resolves the key again.
SELECT h.id
FROM {schema}.job_history AS h
WHERE h.shard = %(shard)s::text AND h.dedupe_key = %(dedupe_key)s::text
  AND h.finished_at >= coalesce(%(now)s::timestamptz, now())
                       - make_interval(secs => %(dedupe_window)s::float8)
LIMIT 1;

-- name: citus_dedupe_savepoint
-- Marks where an insert with a dedupe key and a window starts, so that a lost race with a
-- finishing job (citus_job_dedupe_recheck) undoes only that insert.
SAVEPOINT pgqueue_citus_dedupe;

-- name: citus_dedupe_rollback
-- Undoes the insert that lost the race; the caller resolves the key again.
ROLLBACK TO SAVEPOINT pgqueue_citus_dedupe;

-- name: citus_dedupe_release
-- Keeps the insert; the caller's transaction decides whether it commits.
RELEASE SAVEPOINT pgqueue_citus_dedupe;

-- name: citus_shard_backlog
-- Each shard value with work for these queues, paused queues left out: its queued jobs, its
-- scheduled jobs now due, and in how many seconds its next scheduled job falls due. The one
-- statement a worker runs across every shard, once a round; the claims then name one shard
-- each. It reads every queued and scheduled row: the cost of a round grows with the backlog.
SELECT shard,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'scheduled' AND run_at <= now()) AS due,
       extract(epoch FROM min(run_at) FILTER (WHERE status = 'scheduled') - now())::float8
           AS next_due_in
FROM {schema}.jobs
WHERE queue = ANY(%(queues)s::text[]) AND status IN ('queued', 'scheduled')
  AND queue <> ALL (ARRAY(SELECT p.queue FROM {schema}.queue_pauses AS p))
GROUP BY shard;

-- name: citus_shard_tables
-- Every shard of the schema's jobs, as a worker claims on the nodes: the ids of the jobs
-- shard and of the history shard colocated with it (the same hash range, so on one node), the
-- id of queue_pauses' shard (a reference table: a copy on every node), and the primary node
-- that holds them. Read on the coordinator from Citus's metadata; the worker then runs each
-- shard's statements on that node, on the tables jobs_<id>, job_history_<id> and
-- queue_pauses_<id>.
SELECT j.shardid AS jobs, h.shardid AS history, r.shardid AS pauses,
       n.nodename AS host, n.nodeport AS port
FROM pg_dist_shard AS j
JOIN pg_dist_shard AS h
  ON h.logicalrelid = format('%%I.job_history', {schema_name})::regclass
 AND h.shardminvalue = j.shardminvalue
CROSS JOIN (
    SELECT shardid FROM pg_dist_shard
    WHERE logicalrelid = format('%%I.queue_pauses', {schema_name})::regclass) AS r
JOIN pg_dist_placement AS p ON p.shardid = j.shardid
JOIN pg_dist_node AS n ON n.groupid = p.groupid AND n.noderole = 'primary' AND n.isactive
WHERE j.logicalrelid = format('%%I.jobs', {schema_name})::regclass
ORDER BY j.shardid;

-- name: citus_node_backlog
-- One shard table's queued jobs and scheduled jobs now due (each counted up to %(cap)s: the
-- counts share the worker's free slots, and a count past them would read entries for
-- nothing), and in how many seconds its next scheduled job falls due. Run on the shard's
-- node. Queue by queue and in each index's order, as the claim, so that each reads the first
-- entries of a range of jobs_claim_idx or jobs_scheduled_idx, and never the shard-first
-- indexes, which on a table of many shard keys would be walked whole.
SELECT (SELECT count(*) FROM (
            SELECT 1
            FROM unnest(%(queues)s::text[]) AS q (queue)
            CROSS JOIN LATERAL (
                SELECT 1 FROM {jobs}
                WHERE queue = q.queue AND status = 'queued' AND NOT atomic
                ORDER BY priority, id
                LIMIT %(cap)s) AS j
            WHERE q.queue <> ALL (ARRAY(SELECT p.queue FROM {queue_pauses} AS p))
            LIMIT %(cap)s) AS c) AS queued,
       (SELECT count(*) FROM (
            SELECT 1
            FROM unnest(%(queues)s::text[]) AS q (queue)
            CROSS JOIN LATERAL (
                SELECT 1 FROM {jobs}
                WHERE queue = q.queue AND status = 'scheduled' AND run_at <= now()
                ORDER BY run_at
                LIMIT %(cap)s) AS j
            LIMIT %(cap)s) AS c) AS due,
       (SELECT extract(epoch FROM min(n.run_at) - now())::float8
        FROM unnest(%(queues)s::text[]) AS q (queue)
        CROSS JOIN LATERAL (
            SELECT run_at FROM {jobs}
            WHERE queue = q.queue AND status = 'scheduled'
            ORDER BY run_at
            LIMIT 1) AS n) AS next_due_in

-- name: citus_job_promote
-- Moves one shard's due scheduled jobs of these queues to queued, a bounded batch, skipping
-- rows another worker holds.
WITH due AS (
    SELECT id FROM {jobs}
    WHERE {in_shard} AND queue = ANY(%(queues)s::text[]) AND status = 'scheduled'
      AND run_at <= now()
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} AS j SET status = 'queued'
FROM due
WHERE {in_shard} AND j.id = due.id AND j.status = 'scheduled'
RETURNING j.id;

-- name: citus_job_claim
-- Claims up to %(limit)s queued jobs of one shard key through the coordinator, which runs it
-- as one task on the shard's node, in (priority, id) order, skipping rows other workers hold
-- and queues that are paused. A row updated concurrently is re-checked against status =
-- 'queued' when its lock is taken, so a job is never claimed twice.
WITH picked AS (
    SELECT id
    FROM {jobs}
    WHERE {in_shard}
      AND queue = ANY(%(queues)s::text[])
      AND status = 'queued'
      AND NOT atomic
      AND queue <> ALL (ARRAY(SELECT p.queue FROM {queue_pauses} AS p))
    ORDER BY priority, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {jobs} AS j
SET status = 'running', attempt = j.attempt + 1, started_at = now(), worker_id = %(worker_id)s
FROM picked
WHERE {in_shard} AND j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
          j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited;

-- name: citus_node_claim
-- citus_job_claim on a node: up to %(limit)s queued jobs of a whole shard table, whose many
-- shard keys no shard-first index orders. So queue by queue, in the order given, each in
-- (priority, id) order: a range of jobs_claim_idx, as many entries as the claim takes, where
-- (priority, id) over every queue at once would read and sort every queued job of the table.
-- Through the coordinator citus_job_claim names one shard key, a range of
-- jobs_shard_claim_idx.
WITH picked AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q (queue)
    CROSS JOIN LATERAL (
        SELECT id
        FROM {jobs}
        WHERE queue = q.queue AND status = 'queued' AND NOT atomic
        ORDER BY priority, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.queue <> ALL (ARRAY(SELECT p.queue FROM {queue_pauses} AS p))
    LIMIT %(limit)s
)
UPDATE {jobs} AS j
SET status = 'running', attempt = j.attempt + 1, started_at = now(), worker_id = %(worker_id)s
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
          j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited;

-- name: citus_job_finish
-- Writes one shard's final outcomes (succeeded, failed, cancelled): the jobs leave the hot
-- table and, unless history is off, land in job_history, colocated, on the same node. Each
-- outcome is found by id in one jsonb object. Guard: a row moves only while it is still
-- running this attempt for the worker that claimed it, so a late or duplicate write cannot
-- move a job that was put back or rescued.
WITH batch AS MATERIALIZED (
    SELECT %(outcomes)s::jsonb AS m
), finished AS (
    DELETE FROM {jobs} AS j
    WHERE {in_shard} AND j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
      AND j.worker_id = ((SELECT m FROM batch) -> j.id::text ->> 'worker_id')::bigint
      AND j.attempt = ((SELECT m FROM batch) -> j.id::text ->> 'attempt')::integer
    RETURNING j.*, (SELECT m FROM batch) -> j.id::text AS o
)
INSERT INTO {job_history}
    (shard, id, queue, task, args, status, priority, attempt, max_attempts, run_at, created_at,
     started_at, finished_at, worker_id, errors, result, dedupe_key, retry_of, atomic,
     concurrency_key, workflow_id, progress, tags, limit_keys, fairness_key)
SELECT shard, id, queue, task, args, o ->> 'status', priority, attempt, max_attempts, run_at,
       created_at, started_at,
       coalesce(started_at + make_interval(secs => (o ->> 'duration')::float8), now()),
       worker_id,
       CASE WHEN nullif(o -> 'error', 'null') IS NULL THEN errors
            ELSE errors || jsonb_build_array(o -> 'error') END,
       nullif(o -> 'result', 'null'), dedupe_key, retry_of, atomic, concurrency_key,
       workflow_id, coalesce(nullif(o -> 'progress', 'null'), progress), tags, limit_keys,
       fairness_key
FROM finished
WHERE %(keep_history)s
RETURNING id;

-- name: citus_job_drop
-- citus_job_finish with history off: the finished jobs leave the hot table. Same guard.
DELETE FROM {jobs} AS j
WHERE {in_shard} AND j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
  AND j.worker_id = ((%(outcomes)s::jsonb) -> j.id::text ->> 'worker_id')::bigint
  AND j.attempt = ((%(outcomes)s::jsonb) -> j.id::text ->> 'attempt')::integer
RETURNING j.id;

-- name: citus_job_retry
-- Puts one shard's retried jobs back: scheduled for when their retry falls due (queued when
-- now), the error appended; a snooze gives its attempt back and records no error. Same guard
-- as citus_job_finish. Each outcome arrives with its next status, delay, attempt given back
-- and errors to append worked out (pgqueue/store/citus.py): Citus refuses a CASE, or a
-- STABLE function such as timestamptz + interval, over a row's values in an UPDATE.
UPDATE {jobs} AS j
SET status = %(outcomes)s::jsonb -> j.id::text ->> 'next',
    run_at = to_timestamp(extract(epoch FROM now())::float8
                          + (%(outcomes)s::jsonb -> j.id::text ->> 'retry_in')::float8),
    attempt = j.attempt - (%(outcomes)s::jsonb -> j.id::text ->> 'given_back')::integer,
    errors = j.errors || (%(outcomes)s::jsonb -> j.id::text -> 'append'),
    worker_id = NULL,
    started_at = NULL
WHERE {in_shard} AND j.id = ANY(%(ids)s::bigint[]) AND j.status = 'running'
  AND j.worker_id = (%(outcomes)s::jsonb -> j.id::text ->> 'worker_id')::bigint
  AND j.attempt = (%(outcomes)s::jsonb -> j.id::text ->> 'attempt')::integer
RETURNING j.id;

-- name: citus_job_release
-- Puts a stopping worker's unfinished jobs of one shard back to queued without spending an
-- attempt. Guarded by the worker that holds them.
UPDATE {jobs}
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
WHERE {in_shard} AND id = ANY(%(ids)s::bigint[]) AND status = 'running'
  AND worker_id = %(worker_id)s
RETURNING id;

-- name: citus_job_release_orphans
-- After the claim connection broke, puts back the running jobs this worker holds but never
-- received (a claim committed, its reply was lost), their attempt returned. Claims run on
-- that connection alone, one at a time, so every job of ours not in `known` is such an
-- orphan. Across the shards: this worker's jobs may be on any of them.
UPDATE {schema}.jobs
SET status = 'queued', attempt = attempt - 1, worker_id = NULL, started_at = NULL
WHERE worker_id = %(worker_id)s AND status = 'running' AND NOT (id = ANY(%(known)s::bigint[]))
RETURNING id;

-- name: citus_job_find_stranded
-- Running jobs whose worker is gone (no row) or missed its heartbeats for longer than the
-- lease, with their shards: one read across the shards, the worker rows being the
-- coordinator's. Each is then put back on its own shard (citus_job_rescue), guarded by the
-- worker and attempt read here.
SELECT j.shard, j.id, j.worker_id, j.attempt, j.max_attempts
FROM {schema}.jobs AS j
WHERE j.status = 'running'
  AND j.worker_id <> ALL (ARRAY(
      SELECT w.id FROM {schema}.workers AS w
      WHERE w.heartbeat_at >= now() - make_interval(secs => %(lease)s)))
LIMIT %(limit)s;

-- name: citus_job_rescue
-- Puts back one shard's jobs of dead workers, their attempt spent (the attempt may have run
-- in part), with the error `errors` holds appended (built by the caller: Citus refuses a
-- STABLE function such as jsonb_build_object over a row's values in an UPDATE); one whose
-- attempts are used up is failed instead (citus_job_finish). Guarded by the dead worker and
-- the attempt found.
UPDATE {schema}.jobs AS j
SET status = 'queued', worker_id = NULL, started_at = NULL,
    errors = j.errors || %(errors)s::jsonb
WHERE j.shard = %(shard)s AND j.id = %(id)s AND j.status = 'running'
  AND j.worker_id = %(worker_id)s AND j.attempt = %(attempt)s AND j.attempt < j.max_attempts
RETURNING j.id;

-- name: citus_queue_pause
-- Pauses the given queues (again: keeps the first pause's time, takes the new reason); the
-- queues that were running before. queue_pauses is a reference table, a copy on every node,
-- which each claim reads; no NOTIFY (its write commits on every node, by two-phase commit).
INSERT INTO {schema}.queue_pauses AS p (queue, paused_at, reason)
SELECT q, now(), %(reason)s FROM unnest(%(queues)s::text[]) AS q
ON CONFLICT (queue) DO UPDATE SET reason = excluded.reason
RETURNING p.queue, (p.xmax = 0) AS new;

-- name: citus_queue_resume
-- Resumes the given queues; those that were paused.
DELETE FROM {schema}.queue_pauses WHERE queue = ANY(%(queues)s::text[]) RETURNING queue;
