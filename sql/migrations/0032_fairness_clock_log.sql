-- 0032: the queue's fair clock as a log that only grows.
--
-- The clock moves forward with every fair claim. Kept as one row updated in place
-- (fairness_clocks.vtime), every claim left a dead version of it, and while a long transaction
-- held back VACUUM, every claim and every fair enqueue walked the row's whole chain of them:
-- the queue ran away within seconds. Now a claim that moves the clock inserts its new value;
-- readers take the highest by a backward scan of the index, whose first entry is the newest
-- and live whatever the horizon; the worker's sweep deletes the values below the highest, at
-- the low end such a scan never reaches.
--
-- The commit-time catch-up (0030) read the clock under a share lock on its row, so that a
-- claim moving the clock waited for the enqueue's commit. A log has no such row: a claim that
-- moves the clock takes a transaction-level advisory lock on its queue's clock, and the
-- catch-up takes it shared before it reads, the same handshake without a row to lock.
-- fairness_clocks keeps one row per fair queue (which queues to claim fairly); its vtime is
-- no longer written.

CREATE TABLE {schema}.fairness_clock_log (
    queue text             NOT NULL,
    vtime double precision NOT NULL
);
CREATE INDEX fairness_clock_log_idx ON {schema}.fairness_clock_log (queue, vtime);
INSERT INTO {schema}.fairness_clock_log (queue, vtime)
SELECT queue, vtime FROM {schema}.fairness_clocks;

-- The queue's current virtual time: the highest value any committed claim logged (0 before
-- the first). The scan starts at the top of the queue's range, at the newest entry.
CREATE FUNCTION {schema}.fairness_clock(clock_queue text) RETURNS double precision
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT l.vtime FROM {schema}.fairness_clock_log AS l
                     WHERE l.queue = clock_queue
                     ORDER BY l.vtime DESC
                     LIMIT 1), 0)
$$;

-- The lock that a claim moving `clock_queue`'s clock holds until it commits.
CREATE FUNCTION {schema}.fairness_clock_lock_key(clock_queue text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended('pgqueue.fairness/' || {schema_name} || '/' || clock_queue, 0)
$$;

CREATE OR REPLACE FUNCTION {schema}.fairness_catch_up() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    clock double precision;
BEGIN
    PERFORM pg_advisory_xact_lock_shared({schema}.fairness_clock_lock_key(NEW.queue));
    clock := {schema}.fairness_clock(NEW.queue);
    UPDATE {schema}.jobs AS j
    SET vtime = clock
    WHERE j.id = NEW.id AND j.status = 'queued' AND j.vtime < clock;
    RETURN NULL;
END
$$;
