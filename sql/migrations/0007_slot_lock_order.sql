-- 0007: statements that release many concurrency slots lock them in key order first.
--
-- A claim takes its keys' slot rows in key order (job_claim's upsert). A job leaving
-- 'running' gives its slot back from a row trigger (0005), and a batch of outcomes fires those
-- triggers in job-id order, so a claim and a finish of the same keys could each hold a slot
-- the other waited for: PostgreSQL broke the cycle only after deadlock_timeout, and the
-- worker retried, so under contention deadlocks throttled the claims. Locking the slots of a
-- batch's keys in key order before any of its jobs moves makes every waiter queue in the same
-- order, so no cycle can form; the triggers then update rows this transaction already holds.
--
-- Called as an InitPlan, `(SELECT {schema}.concurrency_lock_slots(ids))`, so it runs once,
-- before the statement's rows move. Returns how many slot rows it locked.
CREATE FUNCTION {schema}.concurrency_lock_slots(ids bigint[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*)::integer FROM (
        SELECT s.key
        FROM {schema}.concurrency_slots AS s
        WHERE s.key IN (SELECT j.concurrency_key FROM {schema}.jobs AS j
                        WHERE j.id = ANY(ids) AND j.concurrency_key IS NOT NULL)
        ORDER BY s.key
        FOR UPDATE OF s
    ) AS locked
$$;
