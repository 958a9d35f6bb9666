-- History retention: deleting finished jobs and old periodic ticks in small batches. Nothing here is on the hot
-- path: claims and completions never read job_history.

-- name: retention_lock
-- Lets one worker prune at a time across the schema; held for one batch, released at commit.
-- A worker that finds it taken leaves the pruning to the holder until its next interval.
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.prune'), hashtext(%(schema)s));

-- name: job_history_prune
-- Deletes at most `limit` finished jobs that finished before the cutoff, oldest first,
-- optionally of some statuses or one queue; returns each deleted row's finished_at. Bounded,
-- so each batch is a short transaction that holds few locks and leaves VACUUM a little work.
-- `after` (the latest finished_at of the previous batch) starts the index walk past the rows
-- already deleted, whose dead entries stay in the index while a long transaction holds back
-- VACUUM: batches never re-walk them. Rows another pruner is deleting are
-- skipped, so concurrent prunes never wait on each other.
DELETE FROM {schema}.job_history
WHERE id IN (
    SELECT id FROM {schema}.job_history
    WHERE finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
      AND finished_at >= coalesce(%(after)s::timestamptz, '-infinity')
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING finished_at;

-- name: periodic_tick_prune
-- Deletes at most `limit` periodic ticks older than the cutoff, oldest first, starting at
-- `after` like job_history_prune; returns each deleted tick. Guard: only ticks at or before
-- their definition's last_tick, which no scheduler pass looks at again.
DELETE FROM {schema}.periodic_ticks
WHERE (name, tick) IN (
    SELECT t.name, t.tick FROM {schema}.periodic_ticks AS t
    JOIN {schema}.periodic AS p ON p.name = t.name AND t.tick <= p.last_tick
    WHERE t.tick < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
      AND t.tick >= coalesce(%(after)s::timestamptz, '-infinity')
    ORDER BY t.tick
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
)
RETURNING tick;

-- name: history_partitions_step
-- One step of the history partitions' upkeep (sql/migrations/0016_history_partitions.sql):
-- what it did, or NULL when nothing was left to do or another worker is at it.
SELECT {schema}.history_partitions_step(%(ahead)s, %(lock_ms)s);

-- name: history_partitions_drop
-- Drops the history partitions whose rows all finished before the cutoff; each with its
-- estimated rows. None while another worker keeps the partitions.
SELECT partition, estimated_rows
FROM {schema}.history_partitions_drop(
    coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s), %(lock_ms)s
);

-- name: job_steps_prune
-- Deletes the recorded steps and signal waits (sql/migrations/0028_durable.sql) of at most
-- `limit` jobs that are in neither the hot table nor the history: pruned or dropped with
-- their day, cancelled while parked, or finished with history off. Returns each job's id,
-- lowest first, so the next batch starts past them (`after`). A job's steps stay while its
-- row does, in either table.
WITH gone AS (
    SELECT DISTINCT s.job_id FROM {schema}.job_steps AS s
    WHERE s.job_id > coalesce(%(after)s::bigint, 0)
      AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.id = s.job_id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.job_history AS h WHERE h.id = s.job_id)
    ORDER BY s.job_id
    LIMIT %(limit)s
), steps AS (
    DELETE FROM {schema}.job_steps AS s USING gone AS g WHERE s.job_id = g.job_id
), waits AS (
    DELETE FROM {schema}.signal_waits AS w
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j WHERE j.id = w.job_id)
)
SELECT job_id FROM gone ORDER BY job_id;
