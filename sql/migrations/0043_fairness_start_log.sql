-- 0043: the fair claim appends its start counts to a log instead of adding them to a row.
--
-- Each fair claim added its starts to one row per key and five-second bucket
-- (fairness_starts), so every claim of a bucket rewrote the rows of its keys. While a long
-- transaction holds back VACUUM, each rewrite leaves a dead version, and the next claim's
-- upsert walks every version of the row (and every index entry of those that no longer fit
-- its page): a walk that grows with the claims of a bucket, so with the rate. Now a claim
-- inserts one row of its own, its keys and their counts, which no other statement reads
-- on the claim's path. The worker's sweep folds the log's rows of past buckets into
-- fairness_starts (fairness_starts_fold), one write per bucket and key, and readers add the
-- log's rows not yet folded to fairness_starts' sums.
CREATE TABLE {schema}.fairness_start_log (
    minute timestamptz NOT NULL,  -- the five-second bucket, as fairness_starts.minute
    queue  text        NOT NULL,
    keys   text[]      NOT NULL,
    counts integer[]   NOT NULL,
    CONSTRAINT counts_match_keys CHECK (cardinality(keys) = cardinality(counts))
);
CREATE INDEX fairness_start_log_minute_idx ON {schema}.fairness_start_log (minute);
