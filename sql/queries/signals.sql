-- Signals: sent in the sender's transaction, taken once by a job that waits for their key
-- (sql/migrations/0028_durable.sql, pgqueue/worker/durable.py).

-- name: signal_lock
-- Serialises, per key, a sender (signal_send takes the same lock) with a job about to park: held until the end of the
-- transaction. The statement after it takes its snapshot once the lock is held (READ
-- COMMITTED), so a job parking sees every signal committed before it, and a sender sees every
-- waiter committed before it: without it, a signal committed while a job parked could find no
-- waiter while the job found no signal, and the job would wait until its timeout.
SELECT pg_advisory_xact_lock(hashtext('pgqueue.signal'), hashtext(%(schema)s || '/' || %(key)s));

-- name: signal_send
-- Stores a signal and wakes the oldest job parked for its key, in one statement and in the
-- caller's transaction (sql/migrations/0028_durable.sql, signal_send): delivered only if it
-- commits. Returns the signal's id.
SELECT {schema}.signal_send(%(key)s, %(payload)s::jsonb);

-- name: signal_take
-- Takes the oldest signal for a key and records it as the job's step `seq`, in one statement:
-- the signal is deleted only if it is recorded, so it is taken once and never lost. Guard:
-- only while the job is still running this attempt for this worker. Also ends the job's wait
-- for it, if it was parked. Returns the recorded step's result, or no row when no signal.
-- This file's guards compare the status with a value the planner does not know, so that no
-- cached plan walks the partial index jobs_running_idx instead of probing the primary key.
WITH mine AS (
    SELECT 1 FROM {schema}.jobs AS j
    WHERE j.id = %(job_id)s AND j.status = (SELECT 'running'::text)
      AND j.worker_id = %(worker_id)s AND j.attempt = %(attempt)s
    FOR SHARE
), taken AS (
    DELETE FROM {schema}.signals
    WHERE id = (
        SELECT s.id FROM {schema}.signals AS s
        WHERE s.key = %(key)s AND EXISTS (SELECT 1 FROM mine)
        ORDER BY s.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING payload, sent_at
), recorded AS (
    INSERT INTO {schema}.job_steps (job_id, seq, name, kind, result, started_at, finished_at)
    SELECT %(job_id)s, %(seq)s, %(name)s, 'signal',
           jsonb_build_object('payload', t.payload, 'sent_at', t.sent_at),
           %(started_at)s, clock_timestamp()
    FROM taken AS t
    RETURNING result
), unparked AS (
    DELETE FROM {schema}.signal_waits
    WHERE job_id = %(job_id)s AND EXISTS (SELECT 1 FROM recorded)
)
SELECT result FROM recorded;

-- name: signal_wait_read
-- When the job's wait at step `seq` times out, if it parked for it before; and the clock.
SELECT w.until, clock_timestamp() FROM {schema}.signal_waits AS w
WHERE w.job_id = %(job_id)s AND w.seq = %(seq)s;

-- name: signal_wait_timeout
-- Records a wait that timed out as the job's step `seq` (result {"timeout": true}) and ends
-- the wait. Guarded like signal_take.
WITH recorded AS (
    INSERT INTO {schema}.job_steps (job_id, seq, name, kind, result, started_at, finished_at)
    SELECT %(job_id)s, %(seq)s, %(name)s, 'signal', '{{"timeout": true}}'::jsonb,
           %(started_at)s, clock_timestamp()
    WHERE EXISTS (
        SELECT 1 FROM {schema}.jobs AS j
        WHERE j.id = %(job_id)s AND j.status = (SELECT 'running'::text)
          AND j.worker_id = %(worker_id)s AND j.attempt = %(attempt)s
        FOR SHARE
    )
    RETURNING result
), unparked AS (
    DELETE FROM {schema}.signal_waits
    WHERE job_id = %(job_id)s AND EXISTS (SELECT 1 FROM recorded)
)
SELECT result FROM recorded;

-- name: signal_park
-- Parks a job until a signal for `key` arrives or its wait times out: the job goes back to
-- scheduled with run_at at the timeout (or `longest` from now), its attempt given back and
-- its worker's slot freed, as a snooze does, and its wait is stored for signal_send to find.
-- Runs after signal_lock in the same transaction, so no signal can commit unseen meanwhile;
-- parks nothing when a signal for the key is already there (the caller runs the job again
-- at once to take it) or when the job's cancellation was requested. Guard: only while the
-- job is still running this attempt for this worker. A job that parks again for the same
-- step keeps its first deadline and its place in line.
WITH parked AS (
    UPDATE {schema}.jobs AS j
    SET status = 'scheduled',
        run_at = least(
            coalesce(
                (SELECT w.until FROM {schema}.signal_waits AS w
                 WHERE w.job_id = j.id AND w.seq = %(seq)s),
                clock_timestamp() + make_interval(secs => %(timeout)s::float8),
                'infinity'),
            clock_timestamp() + make_interval(secs => %(longest)s::float8)),
        worker_id = NULL,
        attempt = j.attempt - 1
    WHERE j.id = %(job_id)s AND j.status = (SELECT 'running'::text)
      AND j.worker_id = %(worker_id)s AND j.attempt = %(attempt)s
      AND j.cancel_requested_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM {schema}.signals AS s WHERE s.key = %(key)s)
    RETURNING j.id
)
INSERT INTO {schema}.signal_waits AS w (job_id, key, seq, until, since)
SELECT p.id, %(key)s, %(seq)s,
       clock_timestamp() + make_interval(secs => %(timeout)s::float8), clock_timestamp()
FROM parked AS p
ON CONFLICT (job_id) DO UPDATE
SET key = excluded.key,
    seq = excluded.seq,
    until = CASE WHEN w.seq = excluded.seq THEN w.until ELSE excluded.until END,
    since = CASE WHEN w.seq = excluded.seq THEN w.since ELSE excluded.since END
RETURNING w.job_id;
