-- 0012: rate limits per task and per concurrency key, within shared queues.
--
-- A row limits the starts of one task's jobs (kind 'task') or one key's (kind 'key'), in any
-- queue, to max_starts in any window of `period`, kept as in rate_limits (0011): `starts` and
-- `counts` are the recorded starts, and the same argument shows that every window holds. The
-- key '*' is the default of every key without a row of its own: a key's first claim under it
-- copies it into a row of the key's own (inherited), which holds that key's window.
--
-- Admission is per job, in the claim (job_claim_rated): the claim locks the rows of the
-- tasks and keys among the jobs it picked, in (kind, name) order, admits the jobs in
-- (priority, id) order while their task and key have room, and records the starts of those
-- it claims at its now(). A job over a limit is put back as scheduled without spending an
-- attempt, for when its window has room, so the claims that follow do not walk it again and
-- the queue's other jobs run meanwhile. Each job put back gets a place of its own: the next
-- time the window makes room for one more start (a period after each recent start), after
-- the places handed out before (park_at, park_n: the last one), so a backlog wakes as the
-- window frees rather than all at once, to be put back again.
CREATE TABLE {schema}.job_rate_limits (
    kind       text          NOT NULL,
    name       text          NOT NULL,
    max_starts integer       NOT NULL,
    period     interval      NOT NULL,
    starts     timestamptz[] NOT NULL DEFAULT '{{}}',
    counts     integer[]     NOT NULL DEFAULT '{{}}',
    inherited  boolean       NOT NULL DEFAULT false,
    park_at    timestamptz,
    park_n     integer       NOT NULL DEFAULT 0,
    PRIMARY KEY (kind, name),
    CONSTRAINT kind_known CHECK (kind IN ('task', 'key')),
    CONSTRAINT max_starts_in_range CHECK (max_starts BETWEEN 1 AND 10000),
    CONSTRAINT period_in_range CHECK (period > interval '0' AND period <= interval '1 day'),
    CONSTRAINT starts_and_counts CHECK (cardinality(starts) = cardinality(counts))
);

-- `n` more starts at `at` added to a window, keeping the entries that hold its most recent
-- max_starts starts (as rate_record does).
CREATE FUNCTION {schema}.rate_push(
    starts timestamptz[], counts integer[], at timestamptz, n integer, max_starts integer,
    OUT kept_starts timestamptz[], OUT kept_counts integer[]
)
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(k.s ORDER BY k.s), '{{}}'),
           coalesce(array_agg(k.c ORDER BY k.s), '{{}}')
    FROM (
        SELECT u.s, u.c,
               coalesce(sum(u.c) OVER (ORDER BY u.s DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                        0) AS newer
        FROM unnest(starts || at, counts || n) AS u(s, c)
    ) AS k
    WHERE k.newer < max_starts
$$;

-- The next `k` times at which a window full with these starts has room for one more, if no
-- other job started meanwhile, after the place (after_at, after_n) already handed out: each
-- of the most recent max_starts starts makes room a period after it, then a period after
-- that, and so on. `rn` tells apart the places at one time (a claim that started several
-- jobs at once makes room for as many). Places come a period after a start, so of the
-- periods after the handed-out place, the first may be past already and the rest are not.
CREATE FUNCTION {schema}.rate_slots(
    starts timestamptz[], counts integer[], period interval, max_starts integer,
    after_at timestamptz, after_n integer, k integer
) RETURNS TABLE (slot timestamptz, rn integer)
LANGUAGE sql IMMUTABLE AS $$
    WITH recent AS (
        SELECT e.s FROM unnest(starts, counts) AS e(s, c), generate_series(1, e.c)
        ORDER BY e.s DESC LIMIT max_starts
    ), span AS (
        SELECT greatest(1, coalesce(floor(extract(epoch FROM after_at - max(s))
                                          / extract(epoch FROM period))::integer, 1)) AS lo
        FROM recent
    ), places AS (
        SELECT r.s + period * m AS slot,
               row_number() OVER (PARTITION BY r.s + period * m)::integer AS rn
        FROM recent AS r, span,
             generate_series(span.lo, span.lo + 1 + ceil(k::numeric / max_starts)::integer)
                 AS m
    )
    SELECT slot, rn FROM places
    WHERE after_at IS NULL OR slot > after_at OR (slot = after_at AND rn > after_n)
    ORDER BY slot, rn
    LIMIT k
$$;

-- Which of the picked jobs (`ids`, in (priority, id) order, with their tasks and keys) may
-- start at `at`: returns each id with back_at NULL (admitted) or the time it was put back to.
-- Locks the limits' rows until the caller's transaction ends; the caller records the starts
-- of the jobs it claims with job_rate_record. jit is off: short statements, run per claim.
CREATE FUNCTION {schema}.job_rate_admit(
    ids bigint[], tasks text[], keys text[], at timestamptz
) RETURNS TABLE (job bigint, back_at timestamptz)
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    lim record;
    room jsonb := '{{}}';    -- 'kind:name' -> starts left in the window ending at `at`
    scopes jsonb := '{{}}';  -- 'kind:name' -> the row's max_starts, period and park cursor
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
        SELECT r.kind, r.name, r.max_starts, r.period, r.park_at, r.park_n,
               r.max_starts - {schema}.rate_used(r.starts, r.counts, r.period, at) AS left_now
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
            'period', extract(epoch FROM lim.period), 'left', lim.left_now,
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
                     {schema}.rate_slots(p.kept_starts, p.kept_counts, r.period, r.max_starts,
                                         r.park_at, r.park_n, cardinality(ids)) AS x
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
            ELSE  -- no start recorded to reckon from (not reached in practice): a period on
                place := greatest(place, at + make_interval(
                    secs => (scopes -> s ->> 'period')::float8));
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

-- Records the starts of the claimed jobs (their tasks and keys) at `at`, in the rows
-- job_rate_admit locked for the same claim.
CREATE FUNCTION {schema}.job_rate_record(tasks text[], keys text[], at timestamptz)
RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    moved integer := 0;
BEGIN
    IF cardinality(tasks) > 0 THEN
        UPDATE {schema}.job_rate_limits AS r
        SET (starts, counts) = (
            SELECT p.kept_starts, p.kept_counts
            FROM {schema}.rate_push(r.starts, r.counts, at, c.n, r.max_starts) AS p
        )
        FROM (
            SELECT 'task' AS kind, t AS name, count(*)::integer AS n
            FROM unnest(tasks) AS t GROUP BY t
            UNION ALL
            SELECT 'key', k, count(*)::integer FROM unnest(keys) AS k
            WHERE k IS NOT NULL GROUP BY k
        ) AS c
        WHERE r.kind = c.kind AND r.name = c.name AND r.name <> '*';
        GET DIAGNOSTICS moved = ROW_COUNT;
    END IF;
    RETURN moved;
END
$$;
