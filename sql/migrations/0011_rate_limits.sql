-- 0011: rate limits: at most max_starts jobs of a queue start in any window of `period`.
--
-- The row is both the limit and its state: `starts` holds the start times of the queue's most
-- recent jobs, at most max_starts of them, ascending. A claim of a limited queue
-- (job_claim_rated) locks the row, counts the starts after (its now() - period), claims at
-- most what is left, and records its jobs' start, which is that same now() (their
-- started_at). Claims of one queue take the row in turn, so no two see the same free slots.
--
-- Why any window holds at most max_starts: take the starts in a window [x, x + period) and
-- the claim among them that took the row last, at time t (x <= t < x + period). The others
-- were recorded before it, each at a time >= x > t - period, so it counted them all (it
-- counts every start after t - period, even one later than t, left by a claim whose
-- transaction began after its own but took the row first); it let in no more than what they
-- left. Keeping only the most recent max_starts starts loses nothing that count needs: if
-- max_starts of them are after t - period, the queue is full whatever came before.
CREATE TABLE {schema}.rate_limits (
    queue      text        PRIMARY KEY,
    max_starts integer     NOT NULL,
    period     interval    NOT NULL,
    starts     timestamptz[] NOT NULL DEFAULT '{{}}',
    CONSTRAINT max_starts_in_range CHECK (max_starts BETWEEN 1 AND 10000),
    CONSTRAINT period_in_range CHECK (period > interval '0' AND period <= interval '1 day')
);

-- How many of `want` jobs queue `q` may start at `at`, taking the queue's row lock until the
-- caller's transaction ends; `want` for a queue without a limit.
CREATE FUNCTION {schema}.rate_allow(q text, want integer, at timestamptz) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    lim {schema}.rate_limits%ROWTYPE;
    used integer;
BEGIN
    SELECT * INTO lim FROM {schema}.rate_limits WHERE queue = q FOR UPDATE;
    IF NOT FOUND THEN
        RETURN want;
    END IF;
    SELECT count(*) INTO used FROM unnest(lim.starts) AS s WHERE s > at - lim.period;
    RETURN greatest(least(want, lim.max_starts - used), 0);
END
$$;

-- Records `n` starts of queue `q` at `at`, keeping the most recent max_starts. Returns in how
-- many seconds the queue has room again (0: it has room now).
CREATE FUNCTION {schema}.rate_record(q text, n integer, at timestamptz) RETURNS float8
LANGUAGE plpgsql
AS $$
DECLARE
    lim {schema}.rate_limits%ROWTYPE;
BEGIN
    UPDATE {schema}.rate_limits AS r
    SET starts = ARRAY(
        SELECT s FROM (
            SELECT s FROM unnest(r.starts || array_fill(at, ARRAY[n])) AS s
            ORDER BY s DESC LIMIT r.max_starts
        ) AS recent
        ORDER BY s
    )
    WHERE r.queue = q AND n > 0;
    SELECT * INTO lim FROM {schema}.rate_limits WHERE queue = q;
    IF NOT FOUND OR cardinality(lim.starts) < lim.max_starts
       OR lim.starts[1] <= at - lim.period THEN
        RETURN 0;
    END IF;
    RETURN extract(epoch FROM lim.starts[1] + lim.period - at);
END
$$;
