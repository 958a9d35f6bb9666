-- 0038: a batch of outcomes locks its jobs' rows before its jobs' slots.
--
-- A claim can hold the row of a job that is already running elsewhere. FOR UPDATE SKIP
-- LOCKED finds the job queued in the claim's snapshot, locks its latest version (claimed and
-- committed since), skips it when the status re-check fails, and keeps that row lock until
-- the claim commits. The claim then waits for its keys' slot rows. A batch of outcomes that
-- had locked its slots first (0007) and then waited for such a job's row closed a cycle,
-- which PostgreSQL broke only after deadlock_timeout, failing one of the two statements.
--
-- Claims never wait for a job row (SKIP LOCKED), and a batch holding its slots no longer waits
-- for anything else: locking the batch's job rows first, in id order, then the slots of their
-- keys in key order, leaves no cycle. A batch may now wait for a claim to commit, never the
-- other way round while it holds slots.
CREATE OR REPLACE FUNCTION {schema}.concurrency_lock_slots(ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    keys text[];
    locked integer;
BEGIN
    SELECT array_agg(DISTINCT k.key) INTO keys
    FROM (SELECT j.concurrency_key, j.limit_keys
          FROM {schema}.jobs AS j
          WHERE j.id = ANY(concurrency_lock_slots.ids)
          ORDER BY j.id
          FOR UPDATE OF j) AS j,
         unnest({schema}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key);
    SELECT count(*)::integer INTO locked FROM (
        SELECT s.key
        FROM {schema}.concurrency_slots AS s
        WHERE s.key = ANY(keys)
        ORDER BY s.key
        FOR UPDATE OF s
    ) AS slots;
    RETURN locked;
END
$$;
