-- 0036: enqueue() in SQL announces its job as a new one, as the client's enqueues do.
--
-- It called wake(), the wake-up of a job that comes back below a worker's hint, which a
-- worker keeping up with a stream of jobs (0035: a row with new_only) never skips; so while
-- such a worker claimed every cooldown anyway, each SQL enqueue still notified and took the
-- database-wide notification lock at its commit. It now calls wake_once(), as the client's
-- insert does: once per queue and transaction, for the lowest (priority, id) enqueued, and
-- skipped by a steady worker's row. The job's transaction takes its id before the job's id
-- (0035's trigger), so the worker finds it by its transaction if it commits late. The rest
-- of the function is 0014's.
CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text,
    args jsonb DEFAULT '{{}}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 25,
    concurrency_key text DEFAULT NULL,
    tags text[] DEFAULT NULL,
    dedupe_key text DEFAULT NULL,
    dedupe_window interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    job_id bigint;
    job_status text;
    payload_limit constant integer := 10 * 1024 * 1024;
BEGIN
    IF task IS NULL OR task !~ '^[A-Za-z_][A-Za-z0-9_.:-]{{0,254}}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: task name %L is not 1-255 letters, digits and '
                             '_ . : -, starting with a letter or _', task);
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,127}}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: queue name %L is not 1-128 letters, digits and '
                             '_ . : -, starting with a letter or digit', queue);
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: args is a JSON object of the task''s parameters by name';
    END IF;
    IF octet_length(args::text) > payload_limit THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: args take %s bytes, over the %s-byte limit',
                             octet_length(args::text), payload_limit);
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: priority %s is not from -100 to 100', priority);
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: max_attempts %s is not from 1 to 1000',
                             max_attempts);
    END IF;
    IF run_at IS NOT NULL AND (run_at = '-infinity' OR run_at > now() + interval '10 years') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: run_at %s is more than ten years ahead', run_at);
    END IF;
    IF concurrency_key IS NOT NULL
       AND (concurrency_key = '*' OR char_length(concurrency_key) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: a concurrency key is 1-255 characters, and not ''*''';
    END IF;
    IF dedupe_key IS NOT NULL AND char_length(dedupe_key) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: a dedupe key is 1-512 characters';
    END IF;
    IF dedupe_window IS NOT NULL
       AND (dedupe_window <= interval '0' OR dedupe_window > interval '10 years') THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: dedupe_window %s is not over 0 and at most ten '
                             'years', dedupe_window);
    END IF;
    IF tags IS NOT NULL AND (cardinality(tags) > 32 OR EXISTS (
           SELECT 1 FROM unnest(tags) AS t WHERE t IS NULL OR char_length(t) NOT BETWEEN 1 AND 128))
    THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: tags are up to 32 strings of 1-128 characters';
    END IF;

    IF enqueue.dedupe_key IS NOT NULL THEN
        -- A live job with the key, or one that finished within the window, is the answer.
        SELECT j.id INTO job_id FROM {schema}.jobs AS j WHERE j.dedupe_key = enqueue.dedupe_key;
        IF FOUND THEN
            RETURN job_id;
        END IF;
        IF enqueue.dedupe_window IS NOT NULL THEN
            SELECT h.id INTO job_id FROM {schema}.job_history AS h
            WHERE h.dedupe_key = enqueue.dedupe_key
              AND h.finished_at >= now() - enqueue.dedupe_window
            ORDER BY h.finished_at DESC LIMIT 1;
            IF FOUND THEN
                RETURN job_id;
            END IF;
        END IF;
    END IF;

    INSERT INTO {schema}.jobs AS j
        (queue, task, args, priority, max_attempts, run_at, concurrency_key, tags, dedupe_key,
         status)
    VALUES (enqueue.queue, enqueue.task, enqueue.args, enqueue.priority, enqueue.max_attempts,
            coalesce(enqueue.run_at, now()), enqueue.concurrency_key, enqueue.tags,
            enqueue.dedupe_key,
            CASE WHEN enqueue.run_at > now() THEN 'scheduled' ELSE 'queued' END)
    ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
    RETURNING j.id, j.status INTO job_id, job_status;

    IF job_id IS NULL THEN
        -- Another transaction stored the key meanwhile and committed (the insert waited for
        -- it): this statement's fresh snapshot sees its job, or its record if it has already
        -- finished.
        SELECT j.id INTO job_id FROM {schema}.jobs AS j WHERE j.dedupe_key = enqueue.dedupe_key;
        IF NOT FOUND THEN
            SELECT h.id INTO job_id FROM {schema}.job_history AS h
            WHERE h.dedupe_key = enqueue.dedupe_key ORDER BY h.finished_at DESC LIMIT 1;
        END IF;
        RETURN job_id;
    END IF;

    IF job_status = 'queued' THEN
        PERFORM {schema}.wake_once(enqueue.queue, enqueue.priority, job_id);
    END IF;
    RETURN job_id;
END
$$;
