-- Workflows: jobs enqueued together, some waiting for others (migration 0010). An enqueue
-- runs workflow_mark, then workflow_insert, in the caller's transaction.

-- name: workflow_mark
-- The jobs a new workflow waits for that were enqueued before it: marks each live one with
-- the workflow (so that its finish settles its dependants) and holds its row lock until the
-- caller commits, so it cannot finish unseen between this statement and the commit: its
-- finish waits for the lock, then sees the new edges. One row per id asked for: `live`, or
-- else its final status and result from history (both NULL: no such job).
WITH marked AS (
    UPDATE {schema}.jobs AS j
    SET workflow_id = coalesce(j.workflow_id, %(workflow)s::bigint)
    WHERE j.id = ANY(%(ids)s::bigint[])
    RETURNING j.id
)
SELECT i.id, m.id IS NOT NULL AS live, h.status, h.result
FROM unnest(%(ids)s::bigint[]) AS i(id)
LEFT JOIN marked AS m ON m.id = i.id
LEFT JOIN {schema}.job_history AS h ON h.id = i.id AND m.id IS NULL;

-- name: workflow_insert
-- Inserts a workflow's jobs with the ids reserved for them (job_id_reserve), its edges and
-- the counts of its blocked jobs, and wakes the workers of each queue at its lowest queued
-- job at commit. A job with unfinished dependencies is 'blocked'; the others are queued or
-- scheduled as any enqueue makes them. Edges to dependencies that already finished arrive
-- with their status and result, and are not counted.
WITH input AS (
    SELECT j.*,
           coalesce(j.run_at, coalesce(%(now)s::timestamptz, now())
                    + make_interval(secs => coalesce(j.delay, 0))) AS due
    FROM jsonb_to_recordset(%(jobs)s::jsonb)
         AS j(id bigint, queue text, task text, args jsonb, priority smallint,
              max_attempts integer, run_at timestamptz, delay double precision, atomic boolean,
              concurrency_key text, limit_keys text[], fairness_key text,
              vtime double precision, tags text[], remaining integer,
              on_failure text,
              result_arg text, result_list boolean)
), inserted AS (
    INSERT INTO {schema}.jobs
        (id, queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key,
         limit_keys, fairness_key, vtime, tags, workflow_id, trace_context, status)
    SELECT id, queue, task, args, priority, max_attempts, due, coalesce(atomic, false),
           concurrency_key, limit_keys, fairness_key, vtime, tags, %(workflow)s::bigint,
           %(trace_context)s::jsonb,
           CASE WHEN remaining > 0 THEN 'blocked'
                WHEN due > coalesce(%(now)s::timestamptz, now()) THEN 'scheduled'
                ELSE 'queued' END
    FROM input
    ORDER BY id
    RETURNING id, queue, status, priority
), edges AS (
    INSERT INTO {schema}.job_deps (depends_on, job_id, position, status, result)
    SELECT e.depends_on, e.job_id, e.position, e.status, e.result
    FROM jsonb_to_recordset(%(edges)s::jsonb)
         AS e(depends_on bigint, job_id bigint, position integer, status text, result jsonb)
    RETURNING job_id
), waits AS (
    INSERT INTO {schema}.job_waits (job_id, remaining, on_failure, result_arg, result_list)
    SELECT id, remaining, on_failure, result_arg, coalesce(result_list, false)
    FROM input WHERE remaining > 0
    RETURNING job_id
)
SELECT (SELECT count(*) FROM inserted) AS jobs,
       (SELECT count(*) FROM edges) AS edges,
       (SELECT count(*) FROM waits) AS waits,
       (SELECT count({schema}.wake(l.queue, l.priority, l.id))
        FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM inserted
              WHERE status = 'queued' ORDER BY queue, priority, id) AS l) AS woken;

-- name: workflow_jobs
-- Every job of a workflow, live and finished, in id order, with what each blocked job still
-- waits for. By the workflow indexes of both tables.
SELECT j.id, j.task, j.queue, j.status, j.attempt, NULL::timestamptz AS finished_at,
       ARRAY(SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id ORDER BY d.position) AS waits_for,
       ARRAY(SELECT d.depends_on FROM {schema}.job_deps AS d
             WHERE d.job_id = j.id AND d.status IS NULL ORDER BY d.position) AS pending,
       j.progress
FROM {schema}.jobs AS j
WHERE j.workflow_id = %(workflow)s
UNION ALL
SELECT h.id, h.task, h.queue, h.status, h.attempt, h.finished_at, ARRAY[]::bigint[],
       ARRAY[]::bigint[], h.progress
FROM {schema}.job_history AS h
WHERE h.workflow_id = %(workflow)s
ORDER BY id;

-- name: workflow_read_members
-- One page of a workflow's jobs, live and finished, in id order after %(after)s: the
-- dashboard's workflow page. By the workflow indexes of both tables. A result arrives as text
-- cut at %(chars)s characters, with its whole length, and the last error cut the same way, so
-- a job with a huge result or error never travels whole.
SELECT m.*
FROM (
    (SELECT j.id, j.task, j.queue, j.status, j.attempt, j.max_attempts, j.created_at,
            NULL::timestamptz AS finished_at, NULL::text AS result_text,
            NULL::integer AS result_chars,
            left(j.errors -> -1 ->> 'error', %(chars)s) AS last_error
     FROM {schema}.jobs AS j
     WHERE j.workflow_id = %(workflow)s AND j.id > %(after)s
     ORDER BY j.id
     LIMIT %(limit)s)
    UNION ALL
    (SELECT h.id, h.task, h.queue, h.status, h.attempt, h.max_attempts, h.created_at,
            h.finished_at, left(h.result::text, %(chars)s), length(h.result::text),
            left(h.errors -> -1 ->> 'error', %(chars)s)
     FROM {schema}.job_history AS h
     WHERE h.workflow_id = %(workflow)s AND h.id > %(after)s
     ORDER BY h.id
     LIMIT %(limit)s)
) AS m
ORDER BY m.id
LIMIT %(limit)s;

-- name: workflow_read_counts
-- How many of a workflow's jobs are in each status, live and finished; no row: no job
-- belongs to it. By the workflow indexes of both tables.
SELECT s.status, count(*)::integer
FROM (SELECT status FROM {schema}.jobs WHERE workflow_id = %(workflow)s
      UNION ALL
      SELECT status FROM {schema}.job_history WHERE workflow_id = %(workflow)s) AS s
GROUP BY s.status
ORDER BY s.status;

-- name: workflow_read_edges
-- The edges that touch jobs %(ids)s: what each waits for (in the order it receives their
-- results) and what waits for each, at most %(per_job)s of each per job, with the outcome
-- each edge recorded (NULL: not finished yet). An edge lives only while its dependant is
-- blocked: workflow_settle deletes it when the dependant is released or cancelled.
SELECT w.job_id, w.depends_on, w.status
FROM unnest(%(ids)s::bigint[]) AS i(id)
CROSS JOIN LATERAL (
    SELECT d.job_id, d.depends_on, d.status FROM {schema}.job_deps AS d
    WHERE d.job_id = i.id ORDER BY d.position LIMIT %(per_job)s
) AS w
UNION
SELECT f.job_id, f.depends_on, f.status
FROM unnest(%(ids)s::bigint[]) AS i(id)
CROSS JOIN LATERAL (
    SELECT d.job_id, d.depends_on, d.status FROM {schema}.job_deps AS d
    WHERE d.depends_on = i.id ORDER BY d.job_id LIMIT %(per_job)s
) AS f;

-- name: job_progress
-- Writes the progress of running jobs in one statement, each only while its worker still runs
-- that attempt (a late write cannot touch a job that moved on). By primary key, like
-- job_finish_many, for the reason given there.
UPDATE {schema}.jobs AS j
SET progress = p.progress
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS p(id bigint, attempt integer, worker_id bigint, progress jsonb)
WHERE j.id = p.id AND j.status = (SELECT 'running'::text) AND j.attempt = p.attempt
  AND j.worker_id = p.worker_id;
