-- 0042: the rescuer's look for orphans reads the workers that were removed, not every
-- running job.
--
-- An orphan is a running job whose worker row is gone: a worker presumed dead (its row
-- removed) whose claim committed after that, before its next beat put the row back, and
-- that then died. The look for them used to walk every entry of jobs_running_idx, and while
-- a long transaction holds the horizon that index keeps an entry for every job that ever
-- ran. Every removal of a worker row is now recorded here, with its time, so the look
-- descends jobs_running_idx once per removed worker (job_find_orphaned). A row leaves once
-- the worker is back, or once it was removed longer ago than the lease and has no running
-- job left (worker_removed_prune): a claim still in flight at the removal commits long
-- before that.
CREATE TABLE {schema}.workers_removed (
    id         bigint      PRIMARY KEY,
    removed_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION {schema}.workers_record_removed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO {schema}.workers_removed (id, removed_at)
    SELECT r.id, now() FROM removed AS r
    ON CONFLICT (id) DO UPDATE SET removed_at = EXCLUDED.removed_at;
    RETURN NULL;
END
$$;

CREATE TRIGGER workers_record_removed AFTER DELETE ON {schema}.workers
REFERENCING OLD TABLE AS removed
FOR EACH STATEMENT EXECUTE FUNCTION {schema}.workers_record_removed();

-- Orphans already there when this runs: their workers were removed before it was recorded.
INSERT INTO {schema}.workers_removed (id)
SELECT DISTINCT j.worker_id FROM {schema}.jobs AS j
WHERE j.status = 'running' AND j.worker_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM {schema}.workers AS w WHERE w.id = j.worker_id);
