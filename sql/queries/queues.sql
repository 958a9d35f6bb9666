-- Queues as an operator sees them: paused or not. A queue has no row of its own until it is
-- paused; its jobs are what make it exist.

-- name: queue_pause
-- Pauses the given queues (again: keeps the first pause's time, takes the new reason); returns
-- the queues that were running before.
WITH paused AS (
    INSERT INTO {schema}.queue_pauses AS p (queue, paused_at, reason)
    SELECT q, coalesce(%(now)s::timestamptz, now()), %(reason)s
    FROM unnest(%(queues)s::text[]) AS q
    ON CONFLICT (queue) DO UPDATE SET reason = excluded.reason
    RETURNING p.queue, (xmax = 0) AS new
)
SELECT queue FROM paused WHERE new ORDER BY queue;

-- name: queue_resume
-- Resumes the given queues and wakes their workers with no position: while a queue was paused
-- its claims came back empty, so a worker may have parked its hint past jobs that are there;
-- a wake-up without a position makes its next claim start from the floor. Returns the queues
-- that were paused.
WITH resumed AS (
    DELETE FROM {schema}.queue_pauses WHERE queue = ANY(%(queues)s::text[]) RETURNING queue
)
SELECT queue, {schema}.wake(queue, NULL, NULL) FROM resumed ORDER BY queue;

-- name: queue_list_paused
-- The paused queues, by name.
SELECT queue, paused_at, reason FROM {schema}.queue_pauses ORDER BY queue;
