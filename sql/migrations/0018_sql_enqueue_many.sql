-- 0018: the bulk form of enqueue() in SQL, for a migration or a service that stores many
-- jobs in one call:
--
--   SELECT * FROM {schema}.enqueue_many('[{{"task": "app.send_receipt", "args": {{"order_id": 7}}}},
--                                        {{"task": "app.send_receipt", "args": {{"order_id": 8}},
--                                         "queue": "mail", "priority": -5}}]');
--
-- Each element is a JSON object with enqueue()'s parameters as keys ("task" required; "args",
-- "queue", "priority", "run_at", "max_attempts", "concurrency_key", "tags", "dedupe_key",
-- "dedupe_window" optional). The ids come back in the order given, each job stored by
-- enqueue() itself, so the checks, dedupe and wake-ups are the same. A key enqueue() does not
-- take, or a value of the wrong JSON type, is refused with SQLSTATE 22023 naming the element,
-- before anything of that call is stored; a run_at or dedupe_window string that is not a
-- time or an interval is refused by PostgreSQL's own cast (22007), naming the value.
CREATE FUNCTION {schema}.enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql
AS $$
DECLARE
    job jsonb;
    n bigint;
    known constant text[] := ARRAY['task', 'args', 'queue', 'priority', 'run_at',
                                   'max_attempts', 'concurrency_key', 'tags', 'dedupe_key',
                                   'dedupe_window'];
    kinds constant jsonb := '{{"task": "string", "args": "object", "queue": "string",
                               "priority": "number", "run_at": "string",
                               "max_attempts": "number", "concurrency_key": "string",
                               "tags": "array", "dedupe_key": "string",
                               "dedupe_window": "string"}}';
    bad text;
BEGIN
    IF jsonb_typeof(jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue_many: jobs is a JSON array of job objects';
    END IF;
    -- Every element checked before the first is stored.
    FOR job, n IN SELECT e.value, e.ordinality FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e
    LOOP
        IF jsonb_typeof(job) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue_many: job %s is a JSON %s, not an object',
                                 n, jsonb_typeof(job));
        END IF;
        SELECT string_agg(k, ', ') INTO bad
        FROM jsonb_object_keys(job) AS k WHERE k <> ALL (known);
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue_many: job %s has keys enqueue() does not '
                                 'take: %s (it takes %s)', n, bad, array_to_string(known, ', '));
        END IF;
        SELECT string_agg(format('%s must be a JSON %s', e.key, kinds ->> e.key), ', ')
        INTO bad
        FROM jsonb_each(job) AS e
        WHERE jsonb_typeof(e.value) <> 'null' AND jsonb_typeof(e.value) <> kinds ->> e.key;
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue_many: job %s: %s', n, bad);
        END IF;
        SELECT string_agg(format('%s must be a whole number', k), ', ') INTO bad
        FROM unnest(ARRAY['priority', 'max_attempts']) AS k
        WHERE jsonb_typeof(job -> k) = 'number' AND (job ->> k) !~ '^-?[0-9]{{1,9}}$';
        IF bad IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue_many: job %s: %s', n, bad);
        END IF;
        IF job ? 'tags' AND EXISTS (
            SELECT 1 FROM jsonb_array_elements(job -> 'tags') AS t
            WHERE jsonb_typeof(t) <> 'string'
        ) THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue_many: job %s: tags must be JSON strings', n);
        END IF;
    END LOOP;
    FOR job IN SELECT e.value FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e
               ORDER BY e.ordinality
    LOOP
        RETURN NEXT {schema}.enqueue(
            task => job ->> 'task',
            args => coalesce(job -> 'args', '{{}}'),
            queue => coalesce(job ->> 'queue', 'default'),
            priority => coalesce((job ->> 'priority')::integer, 0),
            run_at => (job ->> 'run_at')::timestamptz,
            max_attempts => coalesce((job ->> 'max_attempts')::integer, 25),
            concurrency_key => job ->> 'concurrency_key',
            tags => (SELECT array_agg(t ORDER BY o)
                     FROM jsonb_array_elements_text(job -> 'tags') WITH ORDINALITY AS x(t, o)),
            dedupe_key => job ->> 'dedupe_key',
            dedupe_window => (job ->> 'dedupe_window')::interval);
    END LOOP;
END
$$;
