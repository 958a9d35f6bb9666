-- 0009: pausing a queue.
--
-- A queue with a row here is paused: the claims skip it, so its jobs stay queued while its
-- running jobs finish. The row is the state, so a pause holds across worker restarts and
-- applies to every worker at its next claim. The claims read this table once per statement,
-- by primary key: with no queue paused that is one probe of an empty index.
CREATE TABLE {schema}.queue_pauses (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    reason text NOT NULL DEFAULT ''
);
