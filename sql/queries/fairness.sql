-- Fair shares across keys within a queue (migration 0030): stamping enqueued jobs with their
-- virtual start time, the fair claim, weights, and what the dashboard and metrics read.

-- name: fairness_stamp_lock
-- Before fairness_stamp, in the same transaction: takes the clock lock of each (queue, key) of
-- the input pairs, in (queue, key) order, held until the transaction ends, so two enqueues of
-- one key take turns and never hand out the same vtimes, and two enqueues never wait on each
-- other in a cycle. A statement of its own, so that the stamp's snapshot, taken after the
-- locks, sees the clock as the enqueue before it left it.
SELECT count(pg_advisory_xact_lock({schema}.fairness_key_lock_key(i.queue, i.key))) AS locked
FROM (SELECT DISTINCT queue, key
      FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS u (queue, key)
      ORDER BY queue, key) AS i;

-- name: fairness_stamp
-- Where the fair jobs of one enqueue start: per (queue, key) of the input pairs (one pair per
-- job), the vtime of its first job and the step (1 / weight) between its jobs, which the
-- caller hands out in input order: the later of the key's clock and the queue's. Logs each
-- key's clock past them (fairness_key_log, migration 0032): that plus the jobs times the
-- step. The first fair job of a queue registers it and tells the workers at commit ('!rates
-- queue'), so they claim it fairly from their next round.
WITH input AS (
    SELECT i.queue, i.key, count(*)::integer AS n
    FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS i (queue, key)
    GROUP BY i.queue, i.key
), clock AS (
    INSERT INTO {schema}.fairness_clocks (queue, vtime)
    SELECT DISTINCT queue, 0 FROM input ORDER BY queue
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue
), told AS (
    SELECT count(pg_notify({wake_channel}, '!rates ' || queue)) AS n FROM clock
), stamped AS (
    SELECT i.queue, i.key, i.n, s.step,
           greatest(coalesce(k.vtime, 0), {schema}.fairness_clock(i.queue)) AS start
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT 1.0 / coalesce((SELECT w.weight FROM {schema}.fairness_weights AS w
                               WHERE w.key = i.key), 1) AS step
    ) AS s
    LEFT JOIN LATERAL (
        SELECT l.vtime FROM {schema}.fairness_key_log AS l
        WHERE l.queue = i.queue AND l.key = i.key
        ORDER BY l.vtime DESC
        LIMIT 1
    ) AS k ON true
), logged AS (
    INSERT INTO {schema}.fairness_key_log (queue, key, vtime)
    SELECT queue, key, start + n * step FROM stamped
    RETURNING 1
)
SELECT queue, key, start, step FROM stamped
WHERE (SELECT n FROM told) IS NOT NULL AND (SELECT count(*) FROM logged) IS NOT NULL;

-- name: job_claim_fair
-- Claims up to %(limit)s queued fair jobs (those with a vtime) of one queue in (priority,
-- vtime, id) order, from the worker's hint: a range scan of jobs_fair_claim_idx starting at
-- (priority, vtime) >= the hint, so dead entries below it are never walked. `>=`, not `>`:
-- a job stamped with exactly the queue's clock may sit at the hint's vtime with a lower id.
-- No queued fair job is behind the queue's clock, which is at or past every hint: enqueues
-- stamp from the clock, and every way back to 'queued' restamps (migration 0030).
-- Keyed jobs are admitted as in job_claim (concurrency_admit). Moves the queue's clock to the
-- highest vtime claimed (a new entry of fairness_clock_log), and logs the starts per key
-- (fairness_start_log, a row per claim). Returns
-- each row's vtime, where the worker's next fair claim starts. Up to (priority, vtime) <= the
-- stop bound: the ceiling for a claim from the hint, a job's own position for the safety net's
-- claim of a job its sweep found (job_sweep_find_fair), whose walk ends there.
WITH picked AS (
    SELECT id, priority, vtime, concurrency_key IS NOT NULL OR limit_keys IS NOT NULL AS keyed
    FROM {schema}.jobs
    WHERE queue = %(queue)s
      AND status = 'queued'
      AND vtime IS NOT NULL
      -- Not `NOT atomic`, which would let the planner pick jobs_claim_idx (its predicate),
      -- as PostgreSQL 15 did for a claim pinned to one priority: that walk passes every
      -- dead entry of the priority (test_sweep.py).
      AND atomic = (SELECT false)
      AND (priority, vtime) >= (%(after_priority)s::smallint, %(after_vtime)s::float8)
      AND (priority, vtime) <= (%(before_priority)s::smallint, %(before_vtime)s::float8)
    ORDER BY priority, vtime, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), admission AS (
    SELECT a.job, a.fits
    FROM {schema}.concurrency_admit(
        ARRAY(SELECT id FROM picked WHERE keyed ORDER BY priority, vtime, id),
        ARRAY(SELECT id FROM picked)) AS a
), claimed AS (
    UPDATE {schema}.jobs AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        started_at = coalesce(%(now)s::timestamptz, now()),
        worker_id = %(worker_id)s
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked WHERE NOT keyed
                           UNION ALL SELECT job FROM admission WHERE fits))
    RETURNING j.id, j.task, j.args, j.priority, j.attempt, j.max_attempts, j.queue, j.worker_id,
              j.trace_context, extract(epoch FROM j.started_at - j.run_at)::float8 AS waited,
              j.vtime, j.fairness_key
), clock AS (
    -- A claim past the queue's clock logs the new value (migration 0032), holding the clock's
    -- lock until it commits, so an enqueue's commit-time catch-up never reads a clock that
    -- a claim committing after it has already passed.
    INSERT INTO {schema}.fairness_clock_log (queue, vtime)
    SELECT %(queue)s, m.top
    FROM (SELECT max(vtime) AS top FROM claimed) AS m
    CROSS JOIN LATERAL (
        SELECT pg_advisory_xact_lock({schema}.fairness_clock_lock_key(%(queue)s))
    ) AS l
    WHERE m.top > {schema}.fairness_clock(%(queue)s)
    RETURNING vtime
), counted AS (
    -- One row of this claim's own, appended: no claim reads or rewrites another's, so a long
    -- transaction's dead rows are never on a claim's path (a row per key and bucket that each
    -- claim added to was: test_fair_claim_walk.py). The sweep folds them into fairness_starts.
    INSERT INTO {schema}.fairness_start_log (minute, queue, keys, counts)
    SELECT to_timestamp(floor(extract(epoch FROM coalesce(%(now)s::timestamptz, now())) / 5) * 5),
           %(queue)s, array_agg(c.key ORDER BY c.key), array_agg(c.n ORDER BY c.key)
    FROM (SELECT fairness_key AS key, count(*)::integer AS n
          FROM claimed
          WHERE fairness_key IS NOT NULL
          GROUP BY fairness_key) AS c
    HAVING count(*) > 0
    RETURNING minute
)
SELECT id, task, args, priority, attempt, max_attempts, queue, worker_id, false AS parked,
       trace_context, waited, vtime
FROM claimed
UNION ALL
SELECT p.id, NULL, NULL, p.priority, NULL, NULL, NULL, NULL, true, NULL, NULL, p.vtime
FROM picked AS p JOIN admission AS a ON a.job = p.id
WHERE NOT a.fits;

-- name: job_sweep_find_fair
-- One slice of the fair claim's safety net (pgqueue/worker/fair.py), as job_sweep_find is the
-- plain claim's: the queued fair jobs of the queue before the worker's fair hint whose row
-- lies in the heap pages [lo, hi), the first %(limit)s in fair claim order, and how many pages
-- the table has now. A TID range scan, bounded by the slice however many dead rows a long
-- transaction keeps. The status is compared with a value the planner does not know, so that
-- it cannot pick jobs_fair_claim_idx instead: that walk would be the claim from the floor.
WITH found AS (
    SELECT j.priority::integer AS priority, j.vtime
    FROM {schema}.jobs AS j
    WHERE j.ctid >= %(lo)s::tid AND j.ctid < %(hi)s::tid
      AND j.queue = %(queue)s
      AND j.status = (SELECT 'queued'::text)
      AND j.vtime IS NOT NULL
      AND NOT j.atomic
      AND (j.priority, j.vtime) < (%(hint_priority)s::smallint, %(hint_vtime)s::float8)
    ORDER BY j.priority, j.vtime, j.id
    LIMIT %(limit)s
)
SELECT pg_relation_size((quote_ident({schema_name}) || '.jobs')::regclass)
           / current_setting('block_size')::bigint AS pages,
       coalesce((SELECT array_agg(f.priority ORDER BY f.priority, f.vtime) FROM found AS f),
                '{{}}') AS priorities,
       coalesce((SELECT array_agg(f.vtime ORDER BY f.priority, f.vtime) FROM found AS f),
                '{{}}') AS vtimes;

-- name: fairness_weight_set
-- Sets one key's weight; jobs enqueued from now on step by 1 / weight.
INSERT INTO {schema}.fairness_weights (key, weight) VALUES (%(key)s, %(weight)s)
ON CONFLICT (key) DO UPDATE SET weight = excluded.weight;

-- name: fairness_weight_delete
-- Removes one key's weight: back to 1.
DELETE FROM {schema}.fairness_weights WHERE key = %(key)s;

-- name: fairness_list
-- Per queue and fairness key: its weight, its queued and running fair jobs, and the share of
-- the queue's fair starts it received over the last %(window)s seconds against the share its
-- weight owes it among the keys that were backlogged or started jobs in that window; for
-- admins (a walk of the queued and running fair jobs, and of the window's start counts).
WITH live AS (
    SELECT queue, fairness_key AS key,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM {schema}.jobs
    WHERE fairness_key IS NOT NULL AND status IN ('queued', 'running', 'waiting')
    GROUP BY queue, fairness_key
), started AS (
    -- The sweep's sums, and the claims' rows it has not folded yet: it moves each row from
    -- the log to the sums in one statement, so a snapshot counts every start once.
    SELECT c.queue, c.key, sum(c.n)::bigint AS n
    FROM (SELECT s.queue, s.key, s.started AS n
          FROM {schema}.fairness_starts AS s
          WHERE s.minute >= coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window)s)
          UNION ALL
          SELECT l.queue, u.key, u.n
          FROM {schema}.fairness_start_log AS l
          CROSS JOIN LATERAL unnest(l.keys, l.counts) AS u (key, n)
          WHERE l.minute >= coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window)s)
         ) AS c
    GROUP BY c.queue, c.key
), keys AS (
    SELECT coalesce(l.queue, s.queue) AS queue, coalesce(l.key, s.key) AS key,
           coalesce(l.queued, 0) AS queued, coalesce(l.running, 0) AS running,
           coalesce(s.n, 0) AS started,
           coalesce((SELECT w.weight FROM {schema}.fairness_weights AS w
                     WHERE w.key = coalesce(l.key, s.key)), 1) AS weight
    FROM live AS l FULL JOIN started AS s ON s.queue = l.queue AND s.key = l.key
)
SELECT queue, key, weight, queued, running, started,
       CASE WHEN sum(started) OVER q > 0
            THEN started::float8 / sum(started) OVER q END AS share,
       weight / sum(weight) OVER q AS owed
FROM keys
WINDOW q AS (PARTITION BY queue)
ORDER BY queue, key;

-- name: fairness_clock_prune
-- Deletes each fair queue's clock values below its highest (the worker's sweep): readers take
-- only the highest, from the top of the index, so what this leaves dead is never walked.
DELETE FROM {schema}.fairness_clock_log AS l
USING (SELECT c.queue, {schema}.fairness_clock(c.queue) AS top
       FROM {schema}.fairness_clocks AS c) AS m
WHERE l.queue = m.queue AND l.vtime < m.top;

-- name: fairness_key_prune
-- Deletes each key's clock values below its highest (the worker's sweep), as
-- fairness_clock_prune does the queues'.
DELETE FROM {schema}.fairness_key_log AS l
USING (SELECT queue, key, max(vtime) AS top
       FROM {schema}.fairness_key_log
       GROUP BY queue, key) AS m
WHERE l.queue = m.queue AND l.key = m.key AND l.vtime < m.top;

-- name: fairness_starts_fold
-- Moves the fair claims' start rows (fairness_start_log) of the buckets that began between 70
-- and 10 seconds ago into fairness_starts, summed per bucket, queue and key (the worker's
-- sweep): by then every claim of the bucket has committed, so each sum is written once. One
-- statement: a reader sees each start in the log or in the sums, never both or neither. It
-- reads only that stretch of the log: while a long transaction holds the horizon, the rows
-- it moved before stay there dead, and a range from the log's start would walk them all. A
-- row it never reaches (its claim committed over a minute late) is still counted from the
-- log by readers, until fairness_starts_prune.
WITH gone AS (
    DELETE FROM {schema}.fairness_start_log AS l
    WHERE l.minute >= coalesce(%(now)s::timestamptz, now()) - interval '70 seconds'
      AND l.minute < coalesce(%(now)s::timestamptz, now()) - interval '10 seconds'
    RETURNING l.minute, l.queue, l.keys, l.counts
), summed AS (
    SELECT g.minute, g.queue, u.key, sum(u.n)::integer AS n
    FROM gone AS g
    CROSS JOIN LATERAL unnest(g.keys, g.counts) AS u (key, n)
    GROUP BY g.minute, g.queue, u.key
)
INSERT INTO {schema}.fairness_starts AS s (minute, queue, key, started)
SELECT minute, queue, key, n FROM summed
ORDER BY minute, queue, key
ON CONFLICT (minute, queue, key) DO UPDATE SET started = s.started + excluded.started;

-- name: fairness_starts_prune
-- Deletes start counts older than a day, folded or not (the worker's sweep); the window the
-- dashboard and metrics read is shorter.
WITH logged AS (  -- a data-modifying CTE runs to completion, read or not
    DELETE FROM {schema}.fairness_start_log
    WHERE minute < coalesce(%(now)s::timestamptz, now()) - interval '1 day'
    RETURNING 1
)
DELETE FROM {schema}.fairness_starts
WHERE minute < coalesce(%(now)s::timestamptz, now()) - interval '1 day';
