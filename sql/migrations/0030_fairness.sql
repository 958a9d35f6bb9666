-- 0030: fair shares across keys (tenants) within a queue.
--
-- A job may carry a fairness_key. Within one priority, fair jobs are claimed in the order of
-- their virtual start time (vtime), not of their ids: start-time fair queueing. Each key has
-- a virtual clock per queue (fairness_keys.vtime, the virtual finish of its last enqueued
-- job): a job's vtime is the later of that clock and the queue's clock, and the key's clock
-- then moves on by 1 / weight. The queue's clock (fairness_clocks) is the highest vtime
-- claimed there, so an idle key's next job starts at the current virtual time, ahead of the
-- backlogs of busy keys, and a backlogged key gets jobs started in proportion to its weight.
--
-- A job that becomes queued (enqueued, or back again) behind the queue's clock is moved up to
-- it at commit (a deferred trigger), so queued fair jobs never sit behind a worker's claim
-- hint: the fair claim can start after the last position it claimed, as the plain claim
-- does, and never walks the dead entries a long transaction keeps at the front of its index.

ALTER TABLE {schema}.jobs
    ADD COLUMN fairness_key text,
    ADD COLUMN vtime double precision,
    ADD CONSTRAINT fairness_key_valid
        CHECK (fairness_key IS NULL OR char_length(fairness_key) BETWEEN 1 AND 255);

-- The fair claim's walk: (priority, vtime) from the worker's hint. Jobs without a vtime are
-- not in it, so queues without fairness keys pay nothing for it.
CREATE INDEX jobs_fair_claim_idx ON {schema}.jobs (queue, priority, vtime, id)
    WHERE status = 'queued' AND vtime IS NOT NULL;

-- A key's weight (default 1): its share of a queue's starts against other backlogged keys.
CREATE TABLE {schema}.fairness_weights (
    key    text             PRIMARY KEY,
    weight double precision NOT NULL,
    CONSTRAINT weight_in_range CHECK (weight > 0 AND weight <= 1000000),
    CONSTRAINT fairness_key_length CHECK (char_length(key) BETWEEN 1 AND 255)
);

-- Per queue and key: the virtual finish of the key's last enqueued job. step and batch are
-- the last enqueue's 1 / weight and job count, so that the upsert can return where that
-- enqueue's jobs start (PostgreSQL 15 has no RETURNING OLD).
CREATE TABLE {schema}.fairness_keys (
    queue text             NOT NULL,
    key   text             NOT NULL,
    vtime double precision NOT NULL,
    step  double precision NOT NULL,
    batch integer          NOT NULL,
    PRIMARY KEY (queue, key)
);

-- Per queue: the highest vtime claimed, the virtual time an idle key restarts at.
CREATE TABLE {schema}.fairness_clocks (
    queue text             PRIMARY KEY,
    vtime double precision NOT NULL DEFAULT 0
);

-- Started fair jobs per queue, key and minute, for the share each key received (dashboard,
-- metrics); the worker's sweep deletes minutes older than a day.
CREATE TABLE {schema}.fairness_starts (
    minute  timestamptz NOT NULL,
    queue   text        NOT NULL,
    key     text        NOT NULL,
    started integer     NOT NULL,
    PRIMARY KEY (minute, queue, key)
);

-- A fair job that becomes queued (enqueued, or back: retried, put back, rescued, un-parked,
-- promoted, released by its workflow) with a vtime behind its queue's clock is moved up to the
-- clock when its transaction commits. Its vtime was read from the clock when its statement
-- ran; claims may have moved the clock, and the workers' hints with it, past that value
-- before the job became visible, and a claim starting at its hint would never reach it.
-- At commit the clock is read under a share lock, held the instant until the commit ends:
-- a claim that moves the clock either committed before (the job lands at or after its
-- jobs) or commits after this job is visible. So every claim that committed before the job
-- was visible claimed nothing after it, and a worker whose fair claim starts where its claim
-- before the last one ended reaches it (pgqueue/worker/fair.py). Only a row behind the
-- clock is written again.
CREATE FUNCTION {schema}.fairness_catch_up() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    clock double precision;
BEGIN
    SELECT c.vtime INTO clock FROM {schema}.fairness_clocks AS c
    WHERE c.queue = NEW.queue
    FOR SHARE;
    UPDATE {schema}.jobs AS j
    SET vtime = clock
    WHERE j.id = NEW.id AND j.status = 'queued' AND j.vtime < clock;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER jobs_fairness_catch_up_on_insert
    AFTER INSERT ON {schema}.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.vtime IS NOT NULL AND NEW.status = 'queued')
    EXECUTE FUNCTION {schema}.fairness_catch_up();

CREATE CONSTRAINT TRIGGER jobs_fairness_catch_up_on_requeue
    AFTER UPDATE OF status ON {schema}.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.vtime IS NOT NULL AND NEW.status = 'queued' AND OLD.status <> 'queued')
    EXECUTE FUNCTION {schema}.fairness_catch_up();
