-- 0006: job_claim parks a saturated key's backlog through a function.
--
-- job_claim used to park the other queued jobs of a saturated key inline. The planner costs
-- that part for the whole backlog of every key it may find saturated, although most claims
-- park nothing: with one key holding a large backlog, a claim from the floor was costed over
-- jit_above_cost, so PostgreSQL JIT-compiled each such claim, which cost far more than the
-- claim itself. A function call is costed as one call, and the function runs its statement only when a key
-- is saturated. jit is off inside: that statement runs once per saturation and compiling it
-- would cost more than running it.
--
-- Runs inside job_claim, in the claim's transaction, after the claim took the slot rows'
-- locks: a finish of the same key waits for them, then un-parks from a new snapshot that sees
-- what was parked here (as in 0005). Jobs in `picked` (the claim's own, locked by it and moved
-- by the claim itself) are left alone. Parks at most 100,000 jobs per key per call.
CREATE FUNCTION {schema}.concurrency_park(saturated text[], picked bigint[]) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    moved integer := 0;
BEGIN
    IF cardinality(saturated) > 0 THEN
        UPDATE {schema}.jobs AS j
        SET status = 'waiting'
        -- = ANY(ARRAY(...)) keeps this a primary-key lookup whatever the estimate: an IN (...)
        -- may become a hash join over a sequential scan of jobs (test_claim_plan.py).
        WHERE j.id = ANY(ARRAY(
            SELECT q.id
            FROM unnest(saturated) AS s(key)
            CROSS JOIN LATERAL (
                SELECT w.id FROM {schema}.jobs AS w
                WHERE w.concurrency_key = s.key AND w.status = 'queued'
                  AND NOT (w.id = ANY(picked))
                ORDER BY w.priority, w.id
                LIMIT 100000
                FOR UPDATE SKIP LOCKED
            ) AS q
        ));
        GET DIAGNOSTICS moved = ROW_COUNT;
    END IF;
    RETURN moved;
END
$$;
