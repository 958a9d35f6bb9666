-- Recurring jobs: one scheduler pass of a worker is one transaction running these in order.

-- name: periodic_state_ensure
-- Records definitions no worker has seen yet, as dealt with up to now: the first start of a
-- definition enqueues nothing from the past. Existing rows are left to periodic_state_lock.
-- Rows go in name order, like the lock below, so two workers' passes cannot deadlock.
INSERT INTO {schema}.periodic (name, definition, last_tick)
SELECT d.name, d.definition, coalesce(%(now)s::timestamptz, now())
FROM jsonb_to_recordset(%(periodics)s::jsonb) AS d(name text, definition jsonb)
ORDER BY d.name
ON CONFLICT (name) DO NOTHING;

-- name: periodic_state_lock
-- Locks this worker's definitions for the pass and returns the latest tick dealt with.
-- Invariant: passes over one definition are serialised, so a missed-tick decision is made
-- once, on the last_tick the previous pass committed.
SELECT name, definition, last_tick, coalesce(%(now)s::timestamptz, now()) AS now
FROM {schema}.periodic
WHERE name = ANY(%(names)s::text[])
ORDER BY name
FOR UPDATE;

-- name: periodic_tick_claim
-- Claims ticks for enqueueing; returns only those no one claimed before. Guard: the primary
-- key (name, tick) admits each tick once, so a tick becomes a job exactly once even if two
-- workers decide on it (the row lock above is for consistent decisions, not for this).
INSERT INTO {schema}.periodic_ticks (name, tick, worker_id, enqueued_at)
SELECT t.name, t.tick, %(worker_id)s, coalesce(%(now)s::timestamptz, now())
FROM jsonb_to_recordset(%(ticks)s::jsonb) AS t(name text, tick timestamptz)
ORDER BY t.name, t.tick
ON CONFLICT (name, tick) DO NOTHING
RETURNING name, tick;

-- name: periodic_tick_link
-- Records the job each claimed tick became, in the transaction that enqueued it.
UPDATE {schema}.periodic_ticks AS t
SET job_id = l.job_id
FROM jsonb_to_recordset(%(links)s::jsonb) AS l(name text, tick timestamptz, job_id bigint)
WHERE t.name = l.name AND t.tick = l.tick AND t.job_id IS NULL;

-- name: periodic_state_advance
-- Stores each definition as this pass saw it and the latest tick it dealt with.
-- Guard: last_tick never moves back, so a pass can never make a tick due again.
UPDATE {schema}.periodic AS p
SET definition = s.definition,
    last_tick = greatest(p.last_tick, s.last_tick),
    updated_at = coalesce(%(now)s::timestamptz, now())
FROM jsonb_to_recordset(%(states)s::jsonb) AS s(name text, definition jsonb, last_tick timestamptz)
WHERE p.name = s.name;

-- name: periodic_list
-- Every recurring job as workers last stored it, with the latest tick that became a job and
-- that job's id: one backward step in periodic_ticks' primary key per definition. checked_at
-- is the database's clock, the one schedulers work by, for "next run" and "last pass" ages.
SELECT p.name, p.definition, p.last_tick, p.updated_at,
       t.tick AS last_enqueued_tick, t.job_id AS last_job_id,
       coalesce(%(now)s::timestamptz, now()) AS checked_at
FROM {schema}.periodic AS p
LEFT JOIN LATERAL (
    SELECT pt.tick, pt.job_id
    FROM {schema}.periodic_ticks AS pt
    WHERE pt.name = p.name
    ORDER BY pt.tick DESC
    LIMIT 1
) AS t ON true
ORDER BY p.name;
