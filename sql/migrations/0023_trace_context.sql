-- 0023: the enqueuer's trace context, carried in the job's row to the worker that runs it, so
-- that its execution span links to the span of its enqueue (pgqueue/tracing.py). NULL unless
-- tracing was on where the job was enqueued; a column without a default costs existing rows
-- nothing, and history does not keep it.
ALTER TABLE {schema}.jobs ADD COLUMN trace_context jsonb;

-- insert_job() with the trace context; the form without it stays for callers that predate it.
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
    tags text[],
    trace_context jsonb
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
         trace_context, status)
    VALUES (insert_job.queue, insert_job.task, insert_job.args, insert_job.priority,
            insert_job.max_attempts, due, insert_job.atomic, insert_job.concurrency_key,
            insert_job.tags, insert_job.trace_context,
            CASE WHEN due > base THEN 'scheduled' ELSE 'queued' END)
    RETURNING j.id INTO job_id;
    IF due <= base THEN
        PERFORM {schema}.wake_once(insert_job.queue, insert_job.priority, job_id);
    END IF;
    RETURN job_id;
END
$$;
