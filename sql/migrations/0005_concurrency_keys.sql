-- 0005: per-key concurrency limits (tenants).
--
-- A job may carry a concurrency_key. concurrency_limits holds each key's max_running; the row
-- keyed '*' is the default for keys without a row (no '*' row: such keys are unlimited).
-- concurrency_slots holds, per key, how many of its jobs are running: the claim raises it with
-- one guarded UPDATE of that row (the serialisation point between claimers), the trigger below
-- lowers it on every way out of 'running', so no code path can forget to.
-- Jobs the claim picked but could not admit are parked as 'waiting': out of the claim index,
-- so later claims never walk them again; each slot freed un-parks the key's next waiting job.

ALTER TABLE {schema}.jobs ADD COLUMN concurrency_key text;
ALTER TABLE {schema}.jobs
    ADD CONSTRAINT concurrency_key_valid
        CHECK (concurrency_key IS NULL
               OR (char_length(concurrency_key) BETWEEN 1 AND 255 AND concurrency_key <> '*')),
    DROP CONSTRAINT status_is_live,
    ADD CONSTRAINT status_is_live
        CHECK (status IN ('queued', 'scheduled', 'running', 'waiting')),
    ADD CONSTRAINT waiting_has_key CHECK (status <> 'waiting' OR concurrency_key IS NOT NULL);

ALTER TABLE {schema}.job_history ADD COLUMN concurrency_key text;

CREATE TABLE {schema}.concurrency_limits (
    key         text    PRIMARY KEY,
    max_running integer NOT NULL,
    CONSTRAINT max_running_not_negative CHECK (max_running >= 0),
    CONSTRAINT limit_key_length CHECK (char_length(key) BETWEEN 1 AND 255)
);

CREATE TABLE {schema}.concurrency_slots (
    key      text    PRIMARY KEY,
    running  integer NOT NULL DEFAULT 0,
    -- How many the last claim let in: SET reads the old row, so the claim can RETURN it
    -- (PostgreSQL 15 has no RETURNING OLD).
    admitted integer NOT NULL DEFAULT 0,
    -- The key's limit as the last claim read it (NULL: unlimited), so the release trigger
    -- needs no lookup; a changed limit is read afresh by the next claim.
    max_running integer,
    CONSTRAINT running_not_negative CHECK (running >= 0)
);

-- A saturated key's other queued jobs are parked in key order; un-parking takes the key's
-- most urgent waiting job; the sweep counts a key's running jobs.
CREATE INDEX jobs_keyed_queued_idx ON {schema}.jobs (concurrency_key, priority, id)
    WHERE status = 'queued' AND concurrency_key IS NOT NULL;
CREATE INDEX jobs_waiting_idx ON {schema}.jobs (concurrency_key, priority, id)
    WHERE status = 'waiting';
CREATE INDEX jobs_keyed_running_idx ON {schema}.jobs (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- The limit of one key: its own row, else the '*' default, else NULL (unlimited; least() and
-- greatest() ignore NULL, so "no limit" needs no special case in the claim).
CREATE FUNCTION {schema}.concurrency_limit(k text) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT max_running FROM {schema}.concurrency_limits
    WHERE key IN (k, '*') ORDER BY key = '*' LIMIT 1
$$;

-- A job left 'running' (finished, retried, put back, rescued, cancelled, deleted): give its
-- slot back and un-park the key's next waiting job, announced like job_insert's wake-ups.
-- The slot UPDATE waits for a concurrent claim's lock on the row and then reads its result;
-- the un-park statement after it takes a new snapshot (READ COMMITTED), so it sees the jobs
-- that claim parked (tests/integration/test_tenants.py pins the race).
CREATE FUNCTION {schema}.concurrency_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    room integer;
    woken integer;
BEGIN
    UPDATE {schema}.concurrency_slots
    SET running = greatest(running - 1, 0)
    WHERE key = OLD.concurrency_key
    RETURNING max_running - running INTO room;
    IF room IS NULL OR room > 0 THEN
        WITH unparked AS (
            UPDATE {schema}.jobs AS j SET status = 'queued'
            WHERE j.id = (
                SELECT w.id FROM {schema}.jobs AS w
                WHERE w.concurrency_key = OLD.concurrency_key AND w.status = 'waiting'
                ORDER BY w.priority, w.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            )
            RETURNING j.queue, j.priority, j.id
        )
        SELECT count(pg_notify({wake_channel}, concat_ws(' ', queue, priority, id)))
        INTO woken FROM unparked;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_concurrency_release_on_update
    AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.concurrency_release();

CREATE TRIGGER jobs_concurrency_release_on_delete
    AFTER DELETE ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.concurrency_release();
