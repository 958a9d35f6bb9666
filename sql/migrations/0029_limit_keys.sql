-- 0029: several limit keys per job.
--
-- A job's keys are its concurrency_key and its limit_keys together (job_keys below), each
-- with its own limit; the job starts only when every one of them has room. The claim admits
-- its picked jobs through concurrency_admit: it takes the slot rows of all their keys in key
-- order in one upsert (the order every claim and every batch of outcomes locks them in, so
-- two never wait on each other in a cycle), then admits the jobs in claim order, each only if
-- all its keys have room, and adds to each counter only what it admitted. A job that does not
-- fit is parked on the first full key it met (waiting_on), and that key's release un-parks it.
--
-- waiting_on NULL means concurrency_key: jobs parked by a claim of an earlier version, which
-- had only that key, need no rewrite.

ALTER TABLE {schema}.jobs
    ADD COLUMN limit_keys text[],
    ADD COLUMN waiting_on text,
    ADD CONSTRAINT limit_keys_valid
        CHECK (limit_keys IS NULL
               OR (cardinality(limit_keys) BETWEEN 1 AND 16 AND '*' <> ALL (limit_keys))),
    DROP CONSTRAINT waiting_has_key,
    ADD CONSTRAINT waiting_has_key
        CHECK (status <> 'waiting' OR concurrency_key IS NOT NULL OR limit_keys IS NOT NULL);

-- Every key of a job, sorted, each once; NULL for a job without keys. The sort is the lock
-- order of slot rows: the same collation as the slot table's key, ORDER BY key.
CREATE FUNCTION {schema}.job_keys(concurrency_key text, limit_keys text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN limit_keys IS NULL THEN
            CASE WHEN concurrency_key IS NULL THEN NULL ELSE ARRAY[concurrency_key] END
        ELSE ARRAY(SELECT DISTINCT k FROM unnest(array_append(limit_keys, concurrency_key)) AS k
                   WHERE k IS NOT NULL ORDER BY k)
    END
$$;

-- Un-parking takes the most urgent job waiting on a key; the old index named the
-- concurrency_key only.
CREATE INDEX jobs_waiting_on_idx ON {schema}.jobs
    ((coalesce(waiting_on, concurrency_key)), priority, id)
    WHERE status = 'waiting';
DROP INDEX {schema}.jobs_waiting_idx;

-- Parking a saturated key's backlog, and asking whether a key has queued jobs, for the keys
-- in limit_keys (the concurrency_key has jobs_keyed_queued_idx).
CREATE INDEX jobs_limit_keys_queued_idx ON {schema}.jobs USING gin (limit_keys)
    WHERE status = 'queued' AND limit_keys IS NOT NULL;

-- Admits the picked keyed jobs `ids` (in claim order) of one claim: returns each with fits,
-- and parks those that do not fit (status 'waiting', waiting_on the first full key met),
-- and the other queued jobs of a key this claim found full (as concurrency_park did, up to
-- 100,000 per key; `picked` are the claim's own jobs, which it moves itself). Must run inside
-- the claim, whose FOR UPDATE holds the rows of `ids`. A key's limit is its own row, else
-- the default '*', else none.
CREATE FUNCTION {schema}.concurrency_admit(ids bigint[], picked bigint[])
RETURNS TABLE (job bigint, fits boolean)
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    key_names text[];
    places integer[];  -- per key of key_names: places left; NULL: unlimited
    added integer[];
    r record;
    one text;
    p integer;
    blocked text;
    parked_ids bigint[] := '{{}}';
    parked_on text[] := '{{}}';
    saturated text[];
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    -- Creates or locks every key's slot row in key order; SET reads the latest version under
    -- the row lock, so `running` is exact whatever the number of claimers.
    WITH locked AS (
        INSERT INTO {schema}.concurrency_slots AS s (key, running, admitted, max_running)
        SELECT u.key, 0, 0, coalesce(l.max_running, d.max_running)
        FROM (SELECT DISTINCT k.key
              FROM {schema}.jobs AS j,
                   unnest({schema}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key)
              WHERE j.id = ANY(ids)) AS u
        LEFT JOIN {schema}.concurrency_limits AS l ON l.key = u.key
        LEFT JOIN {schema}.concurrency_limits AS d ON d.key = '*'
        ORDER BY u.key
        ON CONFLICT (key) DO UPDATE SET max_running = excluded.max_running
        RETURNING s.key, s.max_running - s.running AS room
    )
    SELECT array_agg(l.key ORDER BY l.key), array_agg(l.room ORDER BY l.key) INTO key_names, places
    FROM locked AS l;
    added := array_fill(0, ARRAY[cardinality(key_names)]);
    FOR r IN
        SELECT u.id, {schema}.job_keys(j.concurrency_key, j.limit_keys) AS keys
        FROM unnest(ids) WITH ORDINALITY AS u (id, n)
        JOIN {schema}.jobs AS j ON j.id = u.id
        ORDER BY u.n
    LOOP
        blocked := NULL;
        FOREACH one IN ARRAY r.keys LOOP
            p := array_position(key_names, one);
            IF places[p] <= 0 THEN
                blocked := one;
                EXIT;
            END IF;
        END LOOP;
        IF blocked IS NULL THEN
            FOREACH one IN ARRAY r.keys LOOP
                p := array_position(key_names, one);
                places[p] := places[p] - 1;
                added[p] := added[p] + 1;
            END LOOP;
        ELSE
            parked_ids := parked_ids || r.id;
            parked_on := parked_on || blocked;
        END IF;
        job := r.id;
        fits := blocked IS NULL;
        RETURN NEXT;
    END LOOP;
    UPDATE {schema}.concurrency_slots AS s
    SET running = s.running + a.n, admitted = a.n
    FROM unnest(key_names, added) AS a (key, n)
    WHERE s.key = a.key AND a.n > 0;
    IF cardinality(parked_ids) = 0 THEN
        RETURN;
    END IF;
    UPDATE {schema}.jobs AS j
    SET status = 'waiting', waiting_on = parked_on[array_position(parked_ids, j.id)]
    WHERE j.id = ANY(parked_ids);
    saturated := ARRAY(SELECT DISTINCT x FROM unnest(parked_on) AS x ORDER BY x);
    PERFORM {schema}.concurrency_park(saturated, picked);
    -- The same for jobs carrying a saturated key among their limit_keys.
    UPDATE {schema}.jobs AS j
    SET status = 'waiting', waiting_on = q.key
    FROM (
        SELECT DISTINCT ON (w.id) w.id, s.key
        FROM unnest(saturated) AS s (key)
        CROSS JOIN LATERAL (
            SELECT w.id FROM {schema}.jobs AS w
            WHERE w.limit_keys @> ARRAY[s.key] AND w.status = 'queued'
              AND w.limit_keys IS NOT NULL
              AND NOT (w.id = ANY(picked))
            ORDER BY w.priority, w.id
            LIMIT 100000
            FOR UPDATE SKIP LOCKED
        ) AS w
        ORDER BY w.id, s.key
    ) AS q
    WHERE j.id = q.id AND j.status = 'queued';
END
$$;

-- The saturated key's backlog parked on it (0006), now saying which key it waits on.
CREATE OR REPLACE FUNCTION {schema}.concurrency_park(saturated text[], picked bigint[])
RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    moved integer := 0;
BEGIN
    IF cardinality(saturated) > 0 THEN
        UPDATE {schema}.jobs AS j
        SET status = 'waiting', waiting_on = j.concurrency_key
        -- = ANY(ARRAY(...)) keeps this a primary-key lookup whatever the estimate: an IN (...)
        -- may become a hash join over a sequential scan of jobs (test_claim_plan.py).
        WHERE j.id = ANY(ARRAY(
            SELECT q.id
            FROM unnest(saturated) AS s(key)
            CROSS JOIN LATERAL (
                SELECT w.id FROM {schema}.jobs AS w
                WHERE w.concurrency_key = s.key AND w.status = 'queued'
                  AND NOT (w.id = ANY(picked))
                ORDER BY w.priority, w.id
                LIMIT 100000
                FOR UPDATE SKIP LOCKED
            ) AS q
        ));
        GET DIAGNOSTICS moved = ROW_COUNT;
    END IF;
    RETURN moved;
END
$$;

-- A job left 'running': give back the slot of each of its keys, in key order, and un-park
-- the next job waiting on each key that has room, announced like job_insert's wake-ups.
CREATE OR REPLACE FUNCTION {schema}.concurrency_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    one text;
    room integer;
    woken integer;
BEGIN
    FOREACH one IN ARRAY {schema}.job_keys(OLD.concurrency_key, OLD.limit_keys) LOOP
        room := NULL;
        UPDATE {schema}.concurrency_slots
        SET running = greatest(running - 1, 0)
        WHERE key = one
        RETURNING max_running - running INTO room;
        IF room IS NULL OR room > 0 THEN
            WITH unparked AS (
                UPDATE {schema}.jobs AS j SET status = 'queued'
                WHERE j.id = (
                    SELECT w.id FROM {schema}.jobs AS w
                    WHERE coalesce(w.waiting_on, w.concurrency_key) = one
                      AND w.status = 'waiting'
                    ORDER BY w.priority, w.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                )
                RETURNING j.queue, j.priority, j.id
            )
            SELECT count(pg_notify({wake_channel}, concat_ws(' ', queue, priority, id)))
            INTO woken FROM unparked;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER jobs_concurrency_release_on_update ON {schema}.jobs;
DROP TRIGGER jobs_concurrency_release_on_delete ON {schema}.jobs;

CREATE TRIGGER jobs_concurrency_release_on_update
    AFTER UPDATE OF status ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running'
          AND (OLD.concurrency_key IS NOT NULL OR OLD.limit_keys IS NOT NULL))
    EXECUTE FUNCTION {schema}.concurrency_release();

CREATE TRIGGER jobs_concurrency_release_on_delete
    AFTER DELETE ON {schema}.jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND (OLD.concurrency_key IS NOT NULL OR OLD.limit_keys IS NOT NULL))
    EXECUTE FUNCTION {schema}.concurrency_release();

-- The slot rows of every key of these jobs, locked in key order (0007).
CREATE OR REPLACE FUNCTION {schema}.concurrency_lock_slots(ids bigint[]) RETURNS integer
LANGUAGE sql AS $$
    SELECT count(*)::integer FROM (
        SELECT s.key
        FROM {schema}.concurrency_slots AS s
        WHERE s.key IN (SELECT k.key
                        FROM {schema}.jobs AS j,
                             unnest({schema}.job_keys(j.concurrency_key, j.limit_keys)) AS k (key)
                        WHERE j.id = ANY(ids)
                          AND (j.concurrency_key IS NOT NULL OR j.limit_keys IS NOT NULL))
        ORDER BY s.key
        FOR UPDATE OF s
    ) AS locked
$$;

-- Key rate limits for jobs with several keys: job_rate_admit (0012, 0025) with each job's
-- keys (key_sets: a JSON array with, per job, the array of its keys) in place of one key per
-- job; a job starts only if its task and every one of its keys have room. Rows are locked in
-- (kind, name) order, as there.
CREATE FUNCTION {schema}.job_rate_admit_keys(
    ids bigint[], tasks text[], key_sets jsonb, at timestamptz, margin interval
) RETURNS TABLE (job bigint, back_at timestamptz)
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    lim record;
    room jsonb := '{{}}';    -- 'kind:name' -> starts left in the window ending at `at`
    scopes jsonb := '{{}}';  -- 'kind:name' -> the row's max_starts, reach and park cursor
    st text;
    sks text[];
    all_keys text[];
    full_scopes text[];
    s text;
    place timestamptz;
    slot_ats jsonb;
    slot_rns jsonb;
    n integer;
    back_ids bigint[] := '{{}}';
    back_ats timestamptz[] := '{{}}';
BEGIN
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    all_keys := ARRAY(SELECT DISTINCT u
                      FROM jsonb_array_elements(key_sets) AS s (keys),
                           jsonb_array_elements_text(s.keys) AS u);
    -- Keys under the default get a row of their own, which holds their own window.
    INSERT INTO {schema}.job_rate_limits (kind, name, max_starts, period, inherited)
    SELECT 'key', k.name, d.max_starts, d.period, true
    FROM unnest(all_keys) AS k (name)
    JOIN {schema}.job_rate_limits AS d ON d.kind = 'key' AND d.name = '*'
    ORDER BY k.name
    ON CONFLICT (kind, name) DO NOTHING;
    -- In (kind, name) order, so two claims never wait on each other's rows in a cycle.
    FOR lim IN
        SELECT r.kind, r.name, r.max_starts, r.period + margin AS reach, r.park_at, r.park_n,
               r.max_starts - {schema}.rate_used(r.starts, r.counts, r.period + margin, at)
                   AS left_now
        FROM {schema}.job_rate_limits AS r
        WHERE (r.kind = 'task' AND r.name = ANY(tasks))
           OR (r.kind = 'key' AND r.name <> '*' AND r.name = ANY(all_keys))
        ORDER BY r.kind, r.name
        FOR UPDATE
    LOOP
        s := lim.kind || ':' || lim.name;
        room := room || jsonb_build_object(s, lim.left_now);
        scopes := scopes || jsonb_build_object(s, jsonb_build_object(
            'kind', lim.kind, 'name', lim.name, 'max', lim.max_starts,
            'reach', extract(epoch FROM lim.reach), 'left', lim.left_now,
            'at', lim.park_at, 'n', lim.park_n, 'moved', false));
    END LOOP;
    FOR i IN 1 .. cardinality(ids) LOOP
        st := 'task:' || tasks[i];
        -- The job's keys that have a limit (none for a job without keys).
        sks := ARRAY(SELECT 'key:' || u FROM jsonb_array_elements_text(key_sets -> (i - 1)) AS u
                     WHERE room ? ('key:' || u));
        IF NOT room ? st THEN
            st := NULL;
        END IF;
        IF (st IS NULL OR (room ->> st)::integer > 0)
           AND NOT EXISTS (SELECT 1 FROM unnest(sks) AS x WHERE (room ->> x)::integer <= 0)
        THEN
            IF st IS NOT NULL THEN
                room := jsonb_set(room, ARRAY[st], to_jsonb((room ->> st)::integer - 1));
            END IF;
            FOREACH s IN ARRAY sks LOOP
                room := jsonb_set(room, ARRAY[s], to_jsonb((room ->> s)::integer - 1));
            END LOOP;
            job := ids[i];
            back_at := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Over a limit: the next free place of each full one, the latest of them.
        full_scopes := ARRAY(SELECT x FROM unnest(st || sks) AS x
                             WHERE x IS NOT NULL AND (room ->> x)::integer <= 0);
        place := at;
        FOREACH s IN ARRAY full_scopes LOOP
            IF NOT scopes -> s ? 'slots' THEN
                -- The first put back here: the next times the window has room, counting the
                -- starts this claim admitted, after the places earlier claims handed out.
                SELECT to_jsonb(coalesce(array_agg(x.slot ORDER BY x.slot, x.rn), '{{}}')),
                       to_jsonb(coalesce(array_agg(x.rn ORDER BY x.slot, x.rn), '{{}}'))
                INTO slot_ats, slot_rns
                FROM {schema}.job_rate_limits AS r,
                     {schema}.rate_push(r.starts, r.counts, at,
                                        greatest((scopes -> s ->> 'left')::integer, 0)
                                        - greatest((room ->> s)::integer, 0),
                                        r.max_starts) AS p,
                     {schema}.rate_slots(p.kept_starts, p.kept_counts, r.period + margin,
                                         r.max_starts, r.park_at, r.park_n, cardinality(ids))
                         AS x
                WHERE r.kind = scopes -> s ->> 'kind' AND r.name = scopes -> s ->> 'name';
                scopes := jsonb_set(scopes, ARRAY[s], (scopes -> s) || jsonb_build_object(
                    'slots', slot_ats, 'rns', slot_rns, 'i', 0));
            END IF;
            n := (scopes -> s ->> 'i')::integer;
            IF n < jsonb_array_length(scopes -> s -> 'slots') THEN
                place := greatest(place, (scopes -> s -> 'slots' ->> n)::timestamptz);
                scopes := jsonb_set(scopes, ARRAY[s], (scopes -> s) || jsonb_build_object(
                    'i', n + 1, 'at', scopes -> s -> 'slots' -> n,
                    'n', scopes -> s -> 'rns' -> n, 'moved', true));
            ELSE  -- no start recorded to reckon from (not reached in practice): a reach on
                place := greatest(place, at + make_interval(
                    secs => (scopes -> s ->> 'reach')::float8));
            END IF;
        END LOOP;
        back_ids := back_ids || ids[i];
        back_ats := back_ats || place;
        job := ids[i];
        back_at := place;
        RETURN NEXT;
    END LOOP;
    IF cardinality(back_ids) > 0 THEN
        -- Primary-key lookups: = ANY(...) rather than a join, which could scan jobs.
        UPDATE {schema}.jobs AS j
        SET status = 'scheduled', run_at = back_ats[array_position(back_ids, j.id)]
        WHERE j.id = ANY(back_ids);
        UPDATE {schema}.job_rate_limits AS r
        SET park_at = (c.value ->> 'at')::timestamptz, park_n = (c.value ->> 'n')::integer
        FROM jsonb_each(scopes) AS c
        WHERE (c.value ->> 'moved')::boolean
          AND r.kind = c.value ->> 'kind' AND r.name = c.value ->> 'name';
    END IF;
END
$$;

