-- 0032: the fair clocks as logs that only grow.
--
-- A queue's clock moves forward with every fair claim, and a key's with every enqueue of its
-- jobs. Kept as rows updated in place (fairness_clocks.vtime, fairness_keys.vtime), each move
-- left a dead version, and while a long transaction held back VACUUM, every claim and every
-- fair enqueue walked those rows' whole chains of them: the queue ran away within seconds.
-- Now a move inserts the new value; readers take the highest by a backward scan of the
-- index, whose first entry is the newest and live whatever the horizon; the worker's sweep
-- deletes the values below the highest, at the low end such a scan never reaches.
--
-- Two enqueues of one key took turns on the key's row lock until commit, so they never
-- handed out the same vtimes; they now take turns on a transaction-level advisory lock per
-- key, taken by a statement of its own before the stamp reads the key's clock.
--
-- The commit-time catch-up (0030) read the clock under a share lock on its row, so that a
-- claim moving the clock waited for the enqueue's commit. A log has no such row: a claim that
-- moves the clock takes a transaction-level advisory lock on its queue's clock, and the
-- catch-up takes it shared before it reads, the same handshake without a row to lock.
-- fairness_clocks keeps one row per fair queue (which queues to claim fairly); its vtime,
-- and fairness_keys, are no longer written.

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

CREATE TABLE {schema}.fairness_key_log (
    queue text             NOT NULL,
    key   text             NOT NULL,
    vtime double precision NOT NULL
);
CREATE INDEX fairness_key_log_idx ON {schema}.fairness_key_log (queue, key, vtime);
INSERT INTO {schema}.fairness_key_log (queue, key, vtime)
SELECT queue, key, vtime FROM {schema}.fairness_keys;

-- The lock an enqueue of `lock_key`'s jobs in `lock_queue` holds until it commits.
CREATE FUNCTION {schema}.fairness_key_lock_key(lock_queue text, lock_key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT hashtextextended(
        'pgqueue.fairness-key/' || {schema_name} || '/' || lock_queue || '/' || lock_key, 0)
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
