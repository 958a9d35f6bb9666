-- 0033: the commit-time catch-up finds its job by id alone.
--
-- Its update (0030, 0032) named the job by id and also by `status = 'queued' AND vtime <
-- clock`, which is the fair claim index's predicate and range. A long-lived connection caches
-- a generic plan for a trigger's statements, and where the planner's figures for that small
-- index were stale it chose it over the primary key: each job's catch-up then walked every
-- entry behind the clock. Under a long transaction those are the dead entries of every fair
-- job claimed since, so an enqueue's commit took ever longer, the claims waited for its
-- clock lock, and the queue ran away. The job is read and written by id alone, where only the
-- primary key can serve; the row is this transaction's own (it inserted or updated it), so
-- nothing changes it between the read and the write.

CREATE OR REPLACE FUNCTION {schema}.fairness_catch_up() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    clock double precision;
    job_status text;
    job_vtime double precision;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({schema}.fairness_clock_lock_key(NEW.queue));
    clock := {schema}.fairness_clock(NEW.queue);
    SELECT j.status, j.vtime INTO job_status, job_vtime
    FROM {schema}.jobs AS j
    WHERE j.id = NEW.id;
    IF job_status = 'queued' AND job_vtime < clock THEN
        UPDATE {schema}.jobs AS j SET vtime = clock WHERE j.id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;
