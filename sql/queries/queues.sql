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
-- The paused queues, by name. Workers read it when they start, after their listener
-- reconnects (a notice may have been missed) and, polling only, every poll interval.
SELECT queue, paused_at, reason FROM {schema}.queue_pauses ORDER BY queue;
