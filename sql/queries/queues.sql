-- Queues as an operator sees them: paused or not. A queue has no row of its own until it is
-- paused; its jobs are what make it exist.

-- name: queue_pause
-- Pauses the given queues (again: keeps the first pause's time, takes the new reason); returns
-- the queues that were running before. Tells the workers at commit ('!pause queue',
-- pgqueue/wakeup.py): they leave the queue out of their next claim round, so the claims
-- themselves never read this table.
WITH paused AS (
    INSERT INTO {schema}.queue_pauses AS p (queue, paused_at, reason)
    SELECT q, coalesce(%(now)s::timestamptz, now()), %(reason)s
    FROM unnest(%(queues)s::text[]) AS q
    ON CONFLICT (queue) DO UPDATE SET reason = excluded.reason
    RETURNING p.queue, (xmax = 0) AS new
), told AS (
    SELECT count(pg_notify({wake_channel}, '!pause ' || queue)) AS n FROM paused
)
SELECT queue FROM paused WHERE new AND (SELECT n FROM told) IS NOT NULL ORDER BY queue;

-- name: queue_resume
-- Resumes the given queues and tells their workers at commit ('!resume queue'): they claim the
-- queue again from its first job, since jobs may sit anywhere below their hints by now.
-- Returns the queues that were paused.
WITH resumed AS (
    DELETE FROM {schema}.queue_pauses WHERE queue = ANY(%(queues)s::text[]) RETURNING queue
)
SELECT queue, pg_notify({wake_channel}, '!resume ' || queue) FROM resumed ORDER BY queue;

-- name: queue_list_paused
-- The paused queues, by name.
SELECT queue, paused_at, reason FROM {schema}.queue_pauses ORDER BY queue;

-- name: queue_rate_set
-- Sets a queue's rate limit (at most max_starts starts in any window of `period`), keeping the
-- starts already recorded, and tells its workers at commit ('!rates queue'): they claim it with
-- job_claim_rated from their next round.
WITH set AS (
    INSERT INTO {schema}.rate_limits AS r (queue, max_starts, period)
    VALUES (%(queue)s, %(max_starts)s, make_interval(secs => %(period)s))
    ON CONFLICT (queue) DO UPDATE SET max_starts = excluded.max_starts, period = excluded.period
    RETURNING r.queue
)
SELECT pg_notify({wake_channel}, '!rates ' || queue) FROM set;

-- name: queue_rate_remove
-- Removes a queue's rate limit and tells its workers; returns the queue if it had one.
WITH removed AS (
    DELETE FROM {schema}.rate_limits WHERE queue = %(queue)s RETURNING queue
)
SELECT queue, pg_notify({wake_channel}, '!rates ' || queue) FROM removed;

-- name: queue_rate_list
-- Every rate limit, with the starts in its current window and in how many seconds it has room
-- again (0: now).
SELECT r.queue, r.max_starts, extract(epoch FROM r.period)::float8,
       {schema}.rate_used(r.starts, r.counts, r.period, now()),
       {schema}.rate_room_in(r.starts, r.counts, r.period, r.max_starts, now())
FROM {schema}.rate_limits AS r
ORDER BY r.queue;

-- name: job_rate_set
-- Sets a task's or a key's rate limit (key '*': the default of keys without their own),
-- keeping the starts already recorded; keys under the default take the new one too. Jobs put
-- back before keep their time; later ones are placed from when the window has room. Tells
-- every worker at commit ('!rates *'): they claim with job_claim_rated from their next round.
WITH set AS (
    INSERT INTO {schema}.job_rate_limits AS r (kind, name, max_starts, period)
    VALUES (%(kind)s, %(name)s, %(max_starts)s, make_interval(secs => %(period)s))
    ON CONFLICT (kind, name) DO UPDATE
    SET max_starts = excluded.max_starts, period = excluded.period, inherited = false,
        park_at = NULL, park_n = 0
    RETURNING r.kind, r.name
), inheriting AS (
    UPDATE {schema}.job_rate_limits AS r
    SET max_starts = %(max_starts)s, period = make_interval(secs => %(period)s),
        park_at = NULL, park_n = 0
    WHERE %(kind)s = 'key' AND %(name)s = '*' AND r.kind = 'key' AND r.inherited
    RETURNING 1
)
SELECT pg_notify({wake_channel}, '!rates *'), (SELECT count(*) FROM inheriting) FROM set;

-- name: job_rate_remove
-- Removes a task's or a key's rate limit (the default '*' takes the windows of the keys
-- under it along) and tells every worker; returns the row if there was one.
WITH removed AS (
    DELETE FROM {schema}.job_rate_limits AS r
    WHERE (r.kind = %(kind)s AND r.name = %(name)s)
       OR (%(kind)s = 'key' AND %(name)s = '*' AND r.kind = 'key' AND r.inherited)
    RETURNING r.kind, r.name, r.inherited
)
SELECT name, pg_notify({wake_channel}, '!rates *') FROM removed WHERE NOT inherited;

-- name: job_rate_list
-- Every task's and key's own rate limit (the default '*' included), with the starts in its
-- current window and in how many seconds it has room again (0: now).
SELECT r.kind, r.name, r.max_starts, extract(epoch FROM r.period)::float8,
       {schema}.rate_used(r.starts, r.counts, r.period, now()),
       {schema}.rate_room_in(r.starts, r.counts, r.period, r.max_starts, now())
FROM {schema}.job_rate_limits AS r
WHERE NOT r.inherited
ORDER BY r.kind DESC, r.name;

-- name: queue_controls
-- What workers must know of their queues: which are paused, which have a rate limit, which
-- tasks have one, whether any key has one, and which have had fair jobs (a fairness clock,
-- migration 0030). Read when they start, after their listener reconnects, and when polling
-- only, every poll interval.
SELECT queue, 'paused' AS control FROM {schema}.queue_pauses
UNION ALL
SELECT queue, 'rated' FROM {schema}.rate_limits
UNION ALL
SELECT name, 'task' FROM {schema}.job_rate_limits WHERE kind = 'task'
UNION ALL
SELECT '*', 'keys' WHERE EXISTS (SELECT 1 FROM {schema}.job_rate_limits WHERE kind = 'key')
UNION ALL
SELECT queue, 'fair' FROM {schema}.fairness_clocks;
