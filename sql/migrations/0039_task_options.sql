-- 0039: enqueue() in SQL gives a job its task's declared options, as the client does.
--
-- A task's declaration (its queue, attempts, priority, delay, keys...) lived only in the
-- application's processes, so a job enqueued from SQL (a trigger, a migration, another
-- language) took enqueue()'s fixed defaults: a task declared on queue 'mail' with two
-- attempts got 'default' and 25. The declarations are now written to `tasks` (a worker's
-- start, Queue.sync_tasks(), `pgqueue migrate --app`), and enqueue() reads its task's row:
-- an option given in the call wins, else the task's declared one, else the old default. The
-- options that had a fixed default now default to NULL, which means "the task's"; a task
-- with no row gets the old defaults.
--
-- enqueue_many(jobs) takes a JSON array of objects with enqueue()'s parameters as keys
-- ("task" required); a key left out, or null, is NULL to enqueue(): the task's option. Each
-- job is stored by enqueue() itself, the ids returned in the order given; a key enqueue() does
-- not take, or a value of the wrong JSON type, is refused (SQLSTATE 22023) naming the element,
-- before anything is stored.

-- One row per task name, as last synced. retry_*, timeout, on_lost and compensate_with are
-- for reading (the dashboard, psql): the worker applies them from its own code whatever
-- enqueued the job. limit_keys and fairness_key may be templates ("tenant:{{tenant_id}}").
CREATE TABLE {schema}.tasks (
    name            text             PRIMARY KEY,
    queue           text             NOT NULL,
    priority        smallint         NOT NULL,
    max_attempts    integer          NOT NULL,
    delay           interval,
    dedupe_window   interval,
    atomic          boolean          NOT NULL DEFAULT false,
    concurrency_key text,
    limit_keys      text[],
    fairness_key    text,
    tags            text[],
    retry_base      interval         NOT NULL,
    retry_cap       interval         NOT NULL,
    retry_jitter    double precision NOT NULL,
    timeout         interval,
    on_lost         text             NOT NULL,
    compensate_with text,
    updated_at      timestamptz      NOT NULL DEFAULT now(),
    CONSTRAINT priority_in_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT max_attempts_in_range CHECK (max_attempts BETWEEN 1 AND 1000)
);

-- A task's limit key as its job gets it: a template formatted from the job's args as the
-- client formats it (str.format_map over the JSON arguments), for the fields whose text is
-- the same in both: a field naming an argument that holds a string, a whole number, a
-- boolean or null. {{{{ and }}}} are literal braces. Any other field (an attribute, an index, a
-- format spec, a fraction, an object) is refused, not guessed: its job cannot get the key
-- the client would give it.
CREATE FUNCTION {schema}.task_key(task text, template text, args jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    made text := '';
    rest text := template;
    part text[];
    value jsonb;
BEGIN
    LOOP
        part := regexp_match(rest, '^([^{{}}]*)(\{{\{{|\}}\}}|\{{[^{{}}]*\}}|[{{}}])(.*)$', 's');
        IF part IS NULL THEN
            made := made || rest;
            EXIT;
        END IF;
        made := made || part[1];
        rest := part[3];
        IF part[2] IN ('{{{{', '}}}}') THEN
            made := made || left(part[2], 1);
            CONTINUE;
        END IF;
        IF part[2] !~ '^\{{[A-Za-z_][A-Za-z0-9_]*\}}$' THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue: task %L: key template %L has the field %s, '
                                 'which SQL does not format; enqueue this task from Python',
                                 task, template, part[2]);
        END IF;
        value := args -> substr(part[2], 2, length(part[2]) - 2);
        IF value IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue: task %L: key template %L needs the argument '
                                 '%s, which this job does not have; pass it in args',
                                 task, template, part[2]);
        END IF;
        made := made || CASE
            WHEN jsonb_typeof(value) = 'string' THEN value #>> '{{}}'
            WHEN jsonb_typeof(value) = 'number' AND value::text ~ '^-?[0-9]+$' THEN value::text
            WHEN value = 'true' THEN 'True'
            WHEN value = 'false' THEN 'False'
            WHEN value = 'null' THEN 'None'
        END;
        IF made IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
                MESSAGE = format('pgqueue.enqueue: task %L: key template %L formats %s from '
                                 '%s, which SQL formats only as a string, a whole number, a '
                                 'boolean or null', task, template, part[2], value);
        END IF;
    END LOOP;
    IF char_length(made) NOT BETWEEN 1 AND 255 OR made = '*' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: task %L: key template %L made %L, not a valid '
                             'key (1-255 characters, not ''*'')', task, template, left(made, 300));
    END IF;
    RETURN made;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.enqueue(
    task text,
    args jsonb DEFAULT '{{}}',
    queue text DEFAULT NULL,
    priority integer DEFAULT NULL,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
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
    declared {schema}.tasks%ROWTYPE;
    limits text[];
    payload_limit constant integer := 10 * 1024 * 1024;
BEGIN
    IF task IS NULL OR task !~ '^[A-Za-z_][A-Za-z0-9_.:-]{{0,254}}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: task name %L is not 1-255 letters, digits and '
                             '_ . : -, starting with a letter or _', task);
    END IF;
    IF args IS NULL OR jsonb_typeof(args) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgqueue.enqueue: args is a JSON object of the task''s parameters by name';
    END IF;

    -- The call's options, else the task's declared ones, else the defaults of a task no
    -- process has declared. No row: every field of `declared` is NULL.
    SELECT t.* INTO declared FROM {schema}.tasks AS t WHERE t.name = enqueue.task;
    queue := coalesce(queue, declared.queue, 'default');
    priority := coalesce(priority, declared.priority, 0);
    max_attempts := coalesce(max_attempts, declared.max_attempts, 25);
    concurrency_key := coalesce(concurrency_key, declared.concurrency_key);
    tags := coalesce(tags, declared.tags);
    dedupe_window := coalesce(dedupe_window, declared.dedupe_window);
    IF declared.limit_keys IS NOT NULL THEN
        -- Each key once, in the order declared, as the client's.
        SELECT array_agg(k ORDER BY o) INTO limits
        FROM (SELECT k, min(o) AS o
              FROM unnest(declared.limit_keys) WITH ORDINALITY AS d (template, o),
                   LATERAL {schema}.task_key(enqueue.task, d.template, enqueue.args) AS k
              GROUP BY k) AS made;
    END IF;

    IF queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,127}}$' THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: queue name %L is not 1-128 letters, digits and '
                             '_ . : -, starting with a letter or digit', queue);
    END IF;
    IF octet_length(args::text) > payload_limit THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: args take %s bytes, over the %s-byte limit',
                             octet_length(args::text), payload_limit);
    END IF;
    IF priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: priority %s is not from -100 to 100', priority);
    END IF;
    IF max_attempts NOT BETWEEN 1 AND 1000 THEN
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
    IF declared.atomic AND (concurrency_key IS NOT NULL OR limits IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgqueue.enqueue: task %L is atomic and cannot take a concurrency '
                             'key: an atomic job holds a transaction, not a slot', task);
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
    -- A declared delay counts from now, as the client's; run_at given in the call wins.
    run_at := coalesce(run_at, now() + declared.delay);

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
        (queue, task, args, priority, max_attempts, run_at, atomic, concurrency_key,
         limit_keys, tags, dedupe_key, status)
    VALUES (enqueue.queue, enqueue.task, enqueue.args, enqueue.priority, enqueue.max_attempts,
            coalesce(enqueue.run_at, now()), coalesce(declared.atomic, false),
            enqueue.concurrency_key, limits, enqueue.tags, enqueue.dedupe_key,
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

-- enqueue_many() as 0018 made it, but a key it is not given goes to enqueue() as NULL, so
-- each job takes its task's declared option, as a lone enqueue() does.
CREATE OR REPLACE FUNCTION {schema}.enqueue_many(jobs jsonb) RETURNS SETOF bigint
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
            queue => job ->> 'queue',
            priority => (job ->> 'priority')::integer,
            run_at => (job ->> 'run_at')::timestamptz,
            max_attempts => (job ->> 'max_attempts')::integer,
            concurrency_key => job ->> 'concurrency_key',
            tags => (SELECT array_agg(t ORDER BY o)
                     FROM jsonb_array_elements_text(job -> 'tags') WITH ORDINALITY AS x(t, o)),
            dedupe_key => job ->> 'dedupe_key',
            dedupe_window => (job ->> 'dedupe_window')::interval);
    END LOOP;
END
$$;

-- The roles of an existing installation (`pgqueue grant` grants the same on new ones):
-- whoever may enqueue reads the declarations enqueue() looks up; whoever moves jobs (a
-- worker) also writes them, as a worker does when it starts.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT a.grantee,
               CASE WHEN bool_or(a.privilege_type = 'DELETE') THEN 'SELECT, INSERT, UPDATE'
                    ELSE 'SELECT' END AS privileges
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.jobs'::regclass
          AND a.privilege_type IN ('INSERT', 'DELETE') AND a.grantee <> c.relowner
        GROUP BY a.grantee
    LOOP
        EXECUTE format('GRANT %s ON {schema}.tasks TO %s', found.privileges,
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
