-- 0013: enqueue from SQL: a trigger, a migration, or a service written in another language
-- stores a job in its own transaction, as queue.enqueue does from Python.
--
--   SELECT {schema}.enqueue('app.send_receipt', '{{"order_id": 7}}', queue => 'mail');
--
-- The job appears at the caller's commit and vanishes with its rollback. The checks are
-- enqueue's, each raised with SQLSTATE 22023 (invalid_parameter_value) and a message that
-- names the limit: names as models.py allows them, args a JSON object within the payload
-- limit, priority, attempts, run_at at most ten years ahead, tags. What SQL cannot check is
-- the arguments against the task's signature: the worker does, and a job whose arguments do
-- not fit fails with the reason recorded, as any bad job does. Dedupe keys are not taken
-- here.
--
-- Wake-up as job_insert: at most one notice per queue and transaction, unless a later job
-- goes lower in (priority, id), folded through the same transaction-local setting
-- (pgqueue.woken), so a trigger that enqueues a job per row sends one notice per queue.
CREATE FUNCTION {schema}.enqueue(
    task text,
    args jsonb DEFAULT '{{}}',
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 25,
    concurrency_key text DEFAULT NULL,
    tags text[] DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job_id bigint;
    job_status text;
    woken jsonb;
    seen jsonb;
    slot text := {wake_channel} || ' ' || queue;
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
    IF tags IS NOT NULL AND (cardinality(tags) > 32 OR EXISTS (
           SELECT 1 FROM unnest(tags) AS t WHERE t IS NULL OR char_length(t) NOT BETWEEN 1 AND 128))
    THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: tags are up to 32 strings of 1-128 characters';
    END IF;

    INSERT INTO {schema}.jobs AS j
        (queue, task, args, priority, max_attempts, run_at, concurrency_key, tags, status)
    VALUES (enqueue.queue, enqueue.task, enqueue.args, enqueue.priority, enqueue.max_attempts,
            coalesce(enqueue.run_at, now()), enqueue.concurrency_key, enqueue.tags,
            CASE WHEN enqueue.run_at > now() THEN 'scheduled' ELSE 'queued' END)
    RETURNING j.id, j.status INTO job_id, job_status;

    IF job_status = 'queued' THEN
        woken := coalesce(nullif(current_setting('pgqueue.woken', true), ''), '{{}}')::jsonb;
        seen := woken -> slot;
        IF seen IS NULL OR (enqueue.priority, job_id)
                           < ((seen ->> 0)::integer, (seen ->> 1)::bigint) THEN
            PERFORM {schema}.wake(enqueue.queue, enqueue.priority, job_id);
            PERFORM set_config('pgqueue.woken',
                               (woken || jsonb_build_object(
                                   slot, jsonb_build_array(enqueue.priority, job_id)))::text,
                               true);
        END IF;
    END IF;
    RETURN job_id;
END
$$;
