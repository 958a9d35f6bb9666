-- 0009: pausing a queue.
--
-- A queue with a row here is paused: workers leave it out of their claims, so its jobs stay
-- queued while its running jobs finish. The row is the state, so a pause holds across worker
-- restarts; workers read it when they start and hear of each change at its commit
-- (sql/queries/queues.sql), so a claim never reads it.
CREATE TABLE {schema}.queue_pauses (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    reason text NOT NULL DEFAULT ''
);
