-- 0025: task and key rate limits hold where handlers start, as a queue's does.
--
-- A handler starts a little after its claim, and a backlog drains in full windows claimed
-- exactly a period apart: a few milliseconds more between one window's claim and its
-- handlers' start than the next one's put up to twice a limit's starts in one period of
-- handler starts. The claim (job_claim_rated) now passes a margin: a job it claims under a
-- limit must start within that margin of the claim's time, or its worker puts it back, its
-- attempt unspent (pgqueue/executor.py). job_rate_admit counts a task's or key's starts of
-- its period and that margin back (its reach), and puts a job over the limit back for a
-- start's time plus the reach, so that claims a reach apart keep their handlers' starts a
-- period apart whatever their delays, and no period-long window of handler starts holds
-- more than the limit. The stored rows are unchanged: the period is the user's, the margin
-- the worker's.
--
-- Why: take the handler starts in a window [x, x + period); their claims were at most the
-- margin before each, so all in [x - margin, x + period), a window of the reach, which the
-- claim that took the row last counted whole (0011's argument, with the reach for the
-- period).

-- Which of the picked jobs may start at `at`, as in 0012, counting each limit's starts over
-- its period and `margin` back, and putting jobs over it back for when a window of that
-- reach has room.
CREATE OR REPLACE FUNCTION {schema}.job_rate_admit(
    ids bigint[], tasks text[], keys text[], at timestamptz, margin interval
) RETURNS TABLE (job bigint, back_at timestamptz)
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    lim record;
    room jsonb := '{{}}';    -- 'kind:name' -> starts left in the window ending at `at`
    scopes jsonb := '{{}}';  -- 'kind:name' -> the row's max_starts, reach and park cursor
    st text;
    sk text;
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
    -- Keys under the default get a row of their own, which holds their own window.
    INSERT INTO {schema}.job_rate_limits (kind, name, max_starts, period, inherited)
    SELECT 'key', k.name, d.max_starts, d.period, true
    FROM (SELECT DISTINCT u AS name FROM unnest(keys) AS u WHERE u IS NOT NULL) AS k
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
           OR (r.kind = 'key' AND r.name <> '*' AND r.name = ANY(keys))
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
        sk := 'key:' || keys[i];  -- NULL for a job without a key
        IF NOT room ? st THEN
            st := NULL;
        END IF;
        IF sk IS NOT NULL AND NOT room ? sk THEN
            sk := NULL;
        END IF;
        IF (st IS NULL OR (room ->> st)::integer > 0) AND (sk IS NULL OR (room ->> sk)::integer > 0)
        THEN
            IF st IS NOT NULL THEN
                room := jsonb_set(room, ARRAY[st], to_jsonb((room ->> st)::integer - 1));
            END IF;
            IF sk IS NOT NULL THEN
                room := jsonb_set(room, ARRAY[sk], to_jsonb((room ->> sk)::integer - 1));
            END IF;
            job := ids[i];
            back_at := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Over a limit: the next free place of each full one, the later of the two.
        full_scopes := ARRAY(SELECT x FROM unnest(ARRAY[st, sk]) AS x
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

-- The form of 0012, for callers that pass no margin (a worker of an earlier version, during
-- an upgrade): the limit counts claims only, as it did.
CREATE OR REPLACE FUNCTION {schema}.job_rate_admit(
    ids bigint[], tasks text[], keys text[], at timestamptz
) RETURNS TABLE (job bigint, back_at timestamptz)
LANGUAGE sql
SET jit = off
AS $$
    SELECT a.job, a.back_at FROM {schema}.job_rate_admit(ids, tasks, keys, at, interval '0') AS a
$$;
