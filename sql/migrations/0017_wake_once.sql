-- 0017: one job enqueued inside a longer transaction, in a statement whose plan stays cheap.
--
-- Such an enqueue (in a Django atomic() block, a SQLAlchemy session, a psycopg transaction)
-- used the batch statement, whose wake-up folding is part of the statement: its plan cost
-- more than the insert itself whenever the connection does not keep prepared statements,
-- which is Django's default and PgBouncer's usual setting. wake_once() does that folding in
-- a function, whose plans the session keeps, so a single-job insert can call it per row.
--
-- Folding as job_insert folds: the transaction-local setting pgqueue.woken remembers the
-- lowest (priority, id) announced per queue; a job that is not lower needs no notice of its
-- own, since the one sent already moves the workers' hints at least as far.
CREATE FUNCTION {schema}.wake_once(queue text, priority integer, id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    slot  text := {wake_channel} || ' ' || wake_once.queue;
    woken jsonb := coalesce(nullif(current_setting('pgqueue.woken', true), ''), '{{}}')::jsonb;
    seen  jsonb := woken -> slot;
BEGIN
    IF seen IS NULL
       OR (wake_once.priority, wake_once.id) < ((seen ->> 0)::integer, (seen ->> 1)::bigint) THEN
        PERFORM {schema}.wake(wake_once.queue, wake_once.priority, wake_once.id);
        PERFORM set_config('pgqueue.woken',
                           (woken || jsonb_build_object(
                               slot, jsonb_build_array(wake_once.priority, wake_once.id)))::text,
                           true);
    END IF;
END
$$;
