-- 0034: the outcome writes' slot locking keeps its plan.
--
-- Every batch of outcomes calls concurrency_lock_slots (0007, 0029). As a SQL function its
-- body was planned again at every call (before PostgreSQL 18, a SQL function's plan lives
-- only as long as the statement that calls it): a query on jobs with every index of jobs
-- weighed, at every batch, even one whose jobs have no key. In PL/pgSQL the session keeps
-- the plan. Same query, same lock order.
CREATE OR REPLACE FUNCTION {schema}.concurrency_lock_slots(ids bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    locked integer;
BEGIN
    SELECT count(*)::integer INTO locked FROM (
        SELECT s.key
        FROM {schema}.concurrency_slots AS s
        WHERE s.key IN (SELECT k.key
                        FROM {schema}.jobs AS j,
                             unnest({schema}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key)
                        WHERE j.id = ANY(concurrency_lock_slots.ids)
                          AND (j.concurrency_key IS NOT NULL OR j.limit_keys IS NOT NULL))
        ORDER BY s.key
        FOR UPDATE OF s
    ) AS slots;
    RETURN locked;
END
$$;
