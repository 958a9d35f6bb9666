-- 0002: atomic jobs, whose claim, handler and completion share one transaction.
--
-- An atomic job is claimed by a row lock held for its whole run, never by a committed
-- 'running' status: a crash rolls everything back and the job is claimable again at once.
-- It has its own claim index so the batch claim of ordinary jobs never walks over it.

ALTER TABLE {schema}.jobs ADD COLUMN atomic boolean NOT NULL DEFAULT false;

DROP INDEX {schema}.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON {schema}.jobs (queue, priority, id)
    WHERE status = 'queued' AND NOT atomic;
CREATE INDEX jobs_claim_atomic_idx ON {schema}.jobs (queue, priority, id)
    WHERE status = 'queued' AND atomic;
