-- 0003: dedupe keys, cancellation requests and retry links.
--
-- The hot table holds only live jobs, so a unique index on dedupe_key over it is exactly "at
-- most one queued, scheduled or running job per key": enqueue relies on it with
-- INSERT ... ON CONFLICT DO NOTHING, which also waits for an uncommitted job with the same key.
-- History keeps the key (for dedupe windows), the retry link and the atomic flag (so a retry
-- is claimed the same way as the original).

ALTER TABLE {schema}.jobs
    ADD COLUMN dedupe_key text,
    ADD COLUMN retry_of bigint,
    ADD COLUMN cancel_requested_at timestamptz,
    ADD CONSTRAINT dedupe_key_length CHECK (char_length(dedupe_key) BETWEEN 1 AND 512);

CREATE UNIQUE INDEX jobs_dedupe_key_idx ON {schema}.jobs (dedupe_key) WHERE dedupe_key IS NOT NULL;

-- One live retry per original job: a second `retry` of the same job while the first retry is
-- queued or running is refused by this index, whatever the timing.
CREATE UNIQUE INDEX jobs_retry_of_idx ON {schema}.jobs (retry_of) WHERE retry_of IS NOT NULL;

ALTER TABLE {schema}.job_history
    ADD COLUMN dedupe_key text,
    ADD COLUMN retry_of bigint,
    ADD COLUMN atomic boolean NOT NULL DEFAULT false;

-- The dedupe window looks up the latest finish of a key.
CREATE INDEX job_history_dedupe_key_idx ON {schema}.job_history (dedupe_key, finished_at)
    WHERE dedupe_key IS NOT NULL;
