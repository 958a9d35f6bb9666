-- 0035: no wake-up per enqueue while a worker keeps up with a stream of jobs.
--
-- A worker that claims again every claim_cooldown anyway, because jobs keep arriving, finds
-- each new job with its next claim; the notices that announced them only cost the
-- applications' commits the database-wide notification lock, which makes those commits run
-- one at a time. Such a worker (pgqueue/worker/loop.py, its steady mode) now says so in its
-- wake_listeners rows: `new_only` marks a row whose range skips only the wake-ups of jobs
-- enqueued now (wake_new(), called by the enqueue statements), never those of jobs that come
-- back below its hint (retried, promoted, released, unparked, released by a workflow or a
-- signal: wake()). A row without it skips both, as a busy worker's always did.
--
-- What the claims cannot see is a job committed late, below the hint of a claim that passed
-- it. The worker finds those by the transactions themselves: every statement that inserts
-- jobs first gives its transaction an id (the trigger below), so a job's id is drawn after
-- its transaction's id exists, and a job that a claim passed unseen belongs to a transaction
-- in progress in that claim's snapshot (job_claim_unkeyed returns it). When such a
-- transaction has ended, the worker claims again from where that claim began
-- (pgqueue/worker/claimer.py).
ALTER TABLE {schema}.wake_listeners ADD COLUMN new_only boolean NOT NULL DEFAULT false;

-- Jobs that come back: announced unless every worker of the queue skips them, and a steady
-- worker never does.
CREATE OR REPLACE FUNCTION {schema}.wake(queue text, priority integer, id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM {schema}.wake_listeners AS l
           WHERE l.queue = wake.queue
             AND (l.new_only OR wake.priority < l.below OR wake.priority > l.above)
       ) THEN
        RETURN;
    END IF;
    PERFORM pg_notify({wake_channel}, concat_ws(' ', wake.queue, wake.priority, wake.id));
END
$$;

-- Jobs enqueued by this transaction, their ids drawn in it: announced unless every worker of
-- the queue skips their priority.
CREATE FUNCTION {schema}.wake_new(queue text, priority integer, id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM {schema}.wake_listeners AS l
           WHERE l.queue = wake_new.queue
             AND (wake_new.priority < l.below OR wake_new.priority > l.above)
       ) THEN
        RETURN;
    END IF;
    PERFORM pg_notify({wake_channel}, concat_ws(' ', wake_new.queue, wake_new.priority,
                                                wake_new.id));
END
$$;

-- insert_job's wake-up (0017, 0019): its job is new.
CREATE OR REPLACE FUNCTION {schema}.wake_once(queue text, priority integer, id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    slot  text := {wake_channel} || ' ' || wake_once.queue;
    woken jsonb := coalesce(nullif(current_setting('pgqueue.woken', true), ''), '{{}}')::jsonb;
    seen  jsonb := woken -> slot;
BEGIN
    IF seen IS NULL
       OR (wake_once.priority, wake_once.id) < ((seen ->> 0)::integer, (seen ->> 1)::bigint) THEN
        PERFORM {schema}.wake_new(wake_once.queue, wake_once.priority, wake_once.id);
        PERFORM set_config('pgqueue.woken',
                           (woken || jsonb_build_object(
                               slot, jsonb_build_array(wake_once.priority, wake_once.id)))::text,
                           true);
    END IF;
END
$$;

-- A transaction's id before any job id it draws: a statement-level trigger fires before the
-- statement computes its first row, identity default included. The bulk enqueue, which draws
-- its ids before its COPY, takes the transaction's id first itself (job_id_reserve).
CREATE FUNCTION {schema}.jobs_take_xid() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_current_xact_id();
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_take_xid BEFORE INSERT ON {schema}.jobs
FOR EACH STATEMENT EXECUTE FUNCTION {schema}.jobs_take_xid();
