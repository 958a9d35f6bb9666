-- 0031: a finished job's record keeps its limit keys and fairness key.
--
-- A retry copies its job from history, and a job read back (get_job, the dashboard, `pgqueue
-- jobs show`) shows what limited it: without these a retried tenant job would start outside
-- the limits and the fair share its first run counted in. Nullable, so history written before
-- this reads as a job without them and no row is rewritten.

ALTER TABLE {schema}.job_history
    ADD COLUMN limit_keys text[],
    ADD COLUMN fairness_key text;
