-- Per-key concurrency limits: the statements that set and read them, and the worker's sweep.
-- The admission itself is concurrency_admit (migration 0029), which the claims in jobs.sql
-- call; giving slots back is the trigger of migrations 0005 and 0029. A job's keys are its
-- concurrency_key and its limit_keys; a parked job waits on one of them (waiting_on, NULL
-- meaning its concurrency_key).

-- name: concurrency_limit_set
-- Sets one key's max_running ('*': the default for keys without a row). A lowered limit lets
-- running jobs finish and admits no more until the key is under it; a raised one takes
-- effect through concurrency_unpark, which the caller runs next in the same transaction.
INSERT INTO {schema}.concurrency_limits (key, max_running)
VALUES (%(key)s, %(max_running)s)
ON CONFLICT (key) DO UPDATE SET max_running = excluded.max_running;

-- name: concurrency_limit_delete
-- Removes one key's row: the key falls back to the default ('*' removed: such keys are
-- unlimited). Returns the key if there was a row.
DELETE FROM {schema}.concurrency_limits WHERE key = %(key)s RETURNING key;

-- name: concurrency_limit_list
-- Every key with a limit, running jobs or waiting jobs, the default ('*') first; for admins.
-- Counting waiting jobs (those parked on the key) walks jobs_waiting_on_idx once per key.
SELECT k.key, l.max_running, coalesce(s.running, 0) AS running,
       (SELECT count(*) FROM {schema}.jobs AS w
        WHERE coalesce(w.waiting_on, w.concurrency_key) = k.key
          AND w.status = 'waiting') AS waiting
FROM (SELECT key FROM {schema}.concurrency_limits
      UNION SELECT key FROM {schema}.concurrency_slots) AS k
LEFT JOIN {schema}.concurrency_limits AS l ON l.key = k.key
LEFT JOIN {schema}.concurrency_slots AS s ON s.key = k.key
WHERE l.key IS NOT NULL OR s.running > 0
   OR EXISTS (SELECT 1 FROM {schema}.jobs AS w
              WHERE coalesce(w.waiting_on, w.concurrency_key) = k.key AND w.status = 'waiting')
ORDER BY k.key <> '*', k.key;

-- name: concurrency_unpark
-- Puts jobs waiting on keys (one, or all when %(key)s is NULL) that have room and no queued
-- job carrying them left back to queued: up to the room, at most %(batch)s per key, most urgent
-- first; wakes the workers with the lowest (priority, id) per queue, like job_insert. Used
-- after a limit changes and by the worker's sweep. It may let out more than a concurrent claim
-- admits; those are parked again: the limit itself is only ever enforced by job_claim.
WITH open AS (
    SELECT s.key,
           least(coalesce({schema}.concurrency_limit(s.key) - s.running, %(batch)s),
                 %(batch)s) AS room
    FROM {schema}.concurrency_slots AS s
    WHERE (%(key)s::text IS NULL OR s.key = %(key)s)
      AND EXISTS (SELECT 1 FROM {schema}.jobs AS w
                  WHERE coalesce(w.waiting_on, w.concurrency_key) = s.key
                    AND w.status = 'waiting')
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS q
                      WHERE q.concurrency_key = s.key AND q.status = 'queued')
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS q
                      WHERE q.limit_keys @> ARRAY[s.key] AND q.status = 'queued'
                        AND q.limit_keys IS NOT NULL)
), picked AS (
    SELECT w.id
    FROM open
    CROSS JOIN LATERAL (
        SELECT id FROM {schema}.jobs AS w
        WHERE coalesce(w.waiting_on, w.concurrency_key) = open.key AND w.status = 'waiting'
        ORDER BY w.priority, w.id
        LIMIT greatest(open.room, 0)
        FOR UPDATE SKIP LOCKED
    ) AS w
), unparked AS (
    UPDATE {schema}.jobs AS j SET status = 'queued'
    FROM picked WHERE j.id = picked.id AND j.status = 'waiting'
    RETURNING j.id, j.queue, j.priority
), woken AS (
    SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
    FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM unparked
          ORDER BY queue, priority, id) AS l
)
SELECT (SELECT count(*) FROM unparked) AS unparked, (SELECT n FROM woken) AS woken;

-- name: concurrency_sweep_lock
-- Lets one worker at a time sweep the slots of the schema; released at commit.
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.tenants'), hashtext(%(schema)s));

-- name: concurrency_slot_suspects
-- Keys whose counter disagrees with their running jobs under this statement's snapshot. Only
-- suspects: a claim or finish in flight makes them differ for a moment; concurrency_slot_fix
-- decides under the row lock. Counts every running keyed job's keys once, in one walk.
SELECT s.key
FROM {schema}.concurrency_slots AS s
LEFT JOIN (
    SELECT k.key, count(*) AS n
    FROM {schema}.jobs AS j,
         unnest({schema}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key)
    WHERE j.status = 'running' AND (j.concurrency_key IS NOT NULL OR j.limit_keys IS NOT NULL)
    GROUP BY k.key
) AS c ON c.key = s.key
WHERE s.running <> coalesce(c.n, 0)
ORDER BY s.key
LIMIT 100;

-- name: concurrency_slot_lock
-- Locks one key's counter for the fix that follows in the same transaction: claims and
-- releases of that key wait, so the count taken next (a new snapshot) is exact.
SELECT running FROM {schema}.concurrency_slots WHERE key = %(key)s FOR UPDATE;

-- name: concurrency_slot_fix
-- Sets one locked key's counter to its running jobs' count; returns the old and new values
-- when they differed. Must run after concurrency_slot_lock, in the same transaction.
UPDATE {schema}.concurrency_slots AS s
SET running = c.n
FROM (SELECT count(*)::integer AS n FROM {schema}.jobs
      WHERE (concurrency_key = %(key)s OR limit_keys @> ARRAY[%(key)s::text])
        AND status = 'running') AS c,
     (SELECT running FROM {schema}.concurrency_slots WHERE key = %(key)s) AS old
WHERE s.key = %(key)s AND s.running <> c.n
RETURNING old.running AS was, s.running AS now;
