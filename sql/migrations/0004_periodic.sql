-- 0004: recurring jobs, and an index for history reads by queue and status.
--
-- periodic holds one row per recurring job definition: the definition workers last agreed on
-- and the latest tick dealt with (enqueued, or skipped by the missed-tick policy). A pass of
-- any worker's scheduler locks these rows, so decisions about missed ticks are made once.
-- periodic_ticks holds one row per enqueued tick: its primary key is what makes each tick a
-- job exactly once, whatever the number of workers, their clocks or their state.

CREATE TABLE {schema}.periodic (
    name        text        PRIMARY KEY,
    definition  jsonb       NOT NULL,
    last_tick   timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT periodic_name_length CHECK (char_length(name) BETWEEN 1 AND 255),
    CONSTRAINT definition_is_object CHECK (jsonb_typeof(definition) = 'object')
);

CREATE TABLE {schema}.periodic_ticks (
    name        text        NOT NULL,
    tick        timestamptz NOT NULL,
    job_id      bigint,
    worker_id   bigint,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, tick)
);

-- Retention deletes old ticks across all names by time.
CREATE INDEX periodic_ticks_tick_idx ON {schema}.periodic_ticks (tick);

-- History reads by queue and status, newest first, a page at a time (keyset on
-- (finished_at, id)). Without it such a read walks job_history_finished_idx and filters, which
-- grows with the history for a rare queue/status; the index costs archiving a little more.
CREATE INDEX job_history_queue_status_idx
    ON {schema}.job_history (queue, status, finished_at, id);
