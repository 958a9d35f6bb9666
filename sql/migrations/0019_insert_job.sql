-- 0019: one job inside a longer transaction, stored by a function.
--
-- On a connection that prepares nothing (Django's default, PgBouncer's usual setting), each
-- INSERT statement is parsed and planned again at every enqueue, which cost more than the
-- insert itself; a call of this function is cheap to parse, and PL/pgSQL keeps the plan of
-- the INSERT inside it for the session. Prepared or not, the enqueue is then as cheap.
-- Its row and its wake-up are job_insert_one's; the wake-up is folded with those of the
-- transaction's other statements by wake_once().
CREATE FUNCTION {schema}.insert_job(
    queue text,
    task text,
    args jsonb,
    priority smallint,
    max_attempts integer,
    run_at timestamptz,
    delay double precision,
    clock timestamptz,
    atomic boolean,
    concurrency_key text,
    tags text[]
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    base constant timestamptz := coalesce(insert_job.clock, now());
    due constant timestamptz :=
        coalesce(insert_job.run_at, base + make_interval(secs => coalesce(insert_job.delay, 0)));
    job_id bigint;
BEGIN
    INSERT INTO {schema}.jobs AS j
        (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key, tags,
         status)
    VALUES (insert_job.queue, insert_job.task, insert_job.args, insert_job.priority,
            insert_job.max_attempts, due, insert_job.atomic, insert_job.concurrency_key,
            insert_job.tags, CASE WHEN due > base THEN 'scheduled' ELSE 'queued' END)
    RETURNING j.id INTO job_id;
    IF due <= base THEN
        PERFORM {schema}.wake_once(insert_job.queue, insert_job.priority, job_id);
    END IF;
    RETURN job_id;
END
$$;
