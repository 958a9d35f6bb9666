-- 0011: rate limits: at most max_starts jobs of a queue start in any window of `period`.
--
-- The row is both the limit and its state: `starts` and `counts` say how many of the queue's
-- jobs started at each time, ascending, one entry per claim, and keep as many of the most
-- recent entries as it takes to hold max_starts starts. A claim of a limited queue
-- (job_claim_rated) locks the row, counts the starts after (its now() - period), claims at
-- most what is left, and records its jobs' start, which is that same now() (their
-- started_at). Claims of one queue take the row in turn, so no two see the same free slots.
--
-- Why any window holds at most max_starts: take the starts in a window [x, x + period) and
-- the claim among them that took the row last, at time t (x <= t < x + period). The others
-- were recorded before it, each at a time >= x > t - period, so it counted them all (it
-- counts every start after t - period, even one later than t, left by a claim whose
-- transaction began after its own but took the row first); it let in no more than what they
-- left. Keeping only the entries that make up the most recent max_starts starts loses nothing
-- that count needs: if max_starts of them are after t - period, the queue is full whatever
-- came before.
CREATE TABLE {schema}.rate_limits (
    queue      text          PRIMARY KEY,
    max_starts integer       NOT NULL,
    period     interval      NOT NULL,
    starts     timestamptz[] NOT NULL DEFAULT '{{}}',
    counts     integer[]     NOT NULL DEFAULT '{{}}',
    CONSTRAINT max_starts_in_range CHECK (max_starts BETWEEN 1 AND 10000),
    CONSTRAINT period_in_range CHECK (period > interval '0' AND period <= interval '1 day'),
    CONSTRAINT starts_and_counts CHECK (cardinality(starts) = cardinality(counts))
);

-- How many jobs of a limit's recorded starts fall after `at` - `period`.
CREATE FUNCTION {schema}.rate_used(
    starts timestamptz[], counts integer[], period interval, at timestamptz
) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(sum(c), 0)::integer FROM unnest(starts, counts) AS u(s, c) WHERE s > at - period
$$;

-- In how many seconds after `at` a limit has room for one more start (0: now).
CREATE FUNCTION {schema}.rate_room_in(
    starts timestamptz[], counts integer[], period interval, max_starts integer, at timestamptz
) RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(min(extract(epoch FROM w.s + period - at)::float8), 0)
    FROM (
        SELECT u.s, sum(u.c) OVER (ORDER BY u.s) AS upto, sum(u.c) OVER () AS total
        FROM unnest(starts, counts) AS u(s, c)
        WHERE u.s > at - period
    ) AS w
    -- Room comes when the entries up to this one have left the window.
    WHERE w.total >= max_starts AND w.total - w.upto < max_starts
$$;

-- How many of `want` jobs queue `q` may start at `at`, taking the queue's row lock until the
-- caller's transaction ends; `want` for a queue without a limit.
CREATE FUNCTION {schema}.rate_allow(q text, want integer, at timestamptz) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    lim {schema}.rate_limits%ROWTYPE;
BEGIN
    SELECT * INTO lim FROM {schema}.rate_limits WHERE queue = q FOR UPDATE;
    IF NOT FOUND THEN
        RETURN want;
    END IF;
    RETURN greatest(
        least(want, lim.max_starts - {schema}.rate_used(lim.starts, lim.counts, lim.period, at)),
        0);
END
$$;

-- Records `n` starts of queue `q` at `at`, keeping the entries that hold its most recent
-- max_starts starts. Returns in how many seconds the queue has room again (0: now).
CREATE FUNCTION {schema}.rate_record(q text, n integer, at timestamptz) RETURNS float8
LANGUAGE plpgsql
AS $$
DECLARE
    lim {schema}.rate_limits%ROWTYPE;
BEGIN
    IF n > 0 THEN
        UPDATE {schema}.rate_limits AS r
        SET (starts, counts) = (
            SELECT coalesce(array_agg(k.s ORDER BY k.s), '{{}}'),
                   coalesce(array_agg(k.c ORDER BY k.s), '{{}}')
            FROM (
                SELECT u.s, u.c,
                       coalesce(sum(u.c) OVER (ORDER BY u.s DESC
                                               ROWS BETWEEN UNBOUNDED PRECEDING
                                               AND 1 PRECEDING), 0) AS newer
                FROM unnest(r.starts || at, r.counts || n) AS u(s, c)
            ) AS k
            WHERE k.newer < r.max_starts
        )
        WHERE r.queue = q;
    END IF;
    SELECT * INTO lim FROM {schema}.rate_limits WHERE queue = q;
    IF NOT FOUND
       OR {schema}.rate_used(lim.starts, lim.counts, lim.period, at) < lim.max_starts THEN
        RETURN 0;  -- room now: no need to sort the window for when
    END IF;
    RETURN {schema}.rate_room_in(lim.starts, lim.counts, lim.period, lim.max_starts, at);
END
$$;
