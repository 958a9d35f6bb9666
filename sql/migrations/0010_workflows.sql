-- 0010: workflows (jobs that wait for other jobs), progress and tags.
--
-- A job that waits for others is 'blocked': out of the claim index, so waiting jobs cost the
-- claim nothing. job_deps holds one row per (dependency, dependant) edge; job_waits one row
-- per blocked job, with how many of its dependencies have not finished yet. When a job leaves
-- the hot table, workflow_settle (below) records its outcome on its edges and counts its
-- dependants down; the last one to finish makes a dependant claimable (or cancels it, when a
-- dependency did not succeed and it runs on success only). The count is one row, updated
-- under its lock, so exactly one finishing transaction sees it reach zero, however many
-- dependencies finish at once on however many workers.
--
-- workflow_id marks every job enqueued as part of a workflow, and every job some other job
-- waits for: finishing a job with no mark skips all of this, so plain jobs pay nothing.

ALTER TABLE {schema}.jobs
    ADD COLUMN workflow_id bigint,
    ADD COLUMN progress jsonb,
    ADD COLUMN tags text[],
    DROP CONSTRAINT status_is_live,
    ADD CONSTRAINT status_is_live
        CHECK (status IN ('queued', 'scheduled', 'running', 'waiting', 'blocked')),
    ADD CONSTRAINT tags_count CHECK (cardinality(tags) <= 32),
    ADD CONSTRAINT progress_is_object CHECK (jsonb_typeof(progress) = 'object');

ALTER TABLE {schema}.job_history
    ADD COLUMN workflow_id bigint,
    ADD COLUMN progress jsonb,
    ADD COLUMN tags text[];

-- A workflow's jobs, for get_workflow. Tags have no index: list_jobs(tag=...) walks the
-- primary key newest first as its other filters do, and every job written to either table
-- would pay for one.
CREATE INDEX jobs_workflow_idx ON {schema}.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
CREATE INDEX job_history_workflow_idx ON {schema}.job_history (workflow_id)
    WHERE workflow_id IS NOT NULL;

CREATE TABLE {schema}.job_deps (
    depends_on bigint  NOT NULL,
    job_id     bigint  NOT NULL,
    -- The dependency's place among the dependant's: the order its result is passed in.
    position   integer NOT NULL,
    -- NULL while the dependency has not finished; then its final status and result.
    status     text,
    result     jsonb,
    PRIMARY KEY (depends_on, job_id)
);
CREATE INDEX job_deps_job_idx ON {schema}.job_deps (job_id, position);

CREATE TABLE {schema}.job_waits (
    job_id      bigint  PRIMARY KEY,
    remaining   integer NOT NULL,
    -- 'cancel': a dependency that fails or is cancelled cancels this job (and what waits for
    -- it); 'run': it runs once every dependency has finished, whatever the outcome.
    on_failure  text    NOT NULL DEFAULT 'cancel',
    -- The argument that receives the dependencies' results when it is released, if any: the
    -- one result (result_list false) or the list of them in position order.
    result_arg  text,
    result_list boolean NOT NULL DEFAULT false,
    CONSTRAINT remaining_not_negative CHECK (remaining >= 0),
    CONSTRAINT on_failure_known CHECK (on_failure IN ('cancel', 'run'))
);

-- Jobs `ids` left the hot table with `statuses` ('succeeded', 'failed', 'cancelled') and
-- `results`: settle what waited for them. Returns how many jobs it released or cancelled.
-- Runs in the finishing statement's transaction, after its rows are gone. Each statement in
-- it takes a new snapshot (READ COMMITTED), so it sees the edges of a dependant whose
-- enqueue committed while this transaction waited for the dependency's row lock (the enqueue
-- holds that lock; sql/queries/workflows.sql). Counts are locked in job_id order, so two
-- transactions settling the same dependants never deadlock.
CREATE FUNCTION {schema}.workflow_settle(
    ids bigint[], statuses text[], results jsonb[], keep_history boolean
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    settled integer := 0;
    n integer;
    failed_ids bigint[];
    ready bigint[];
BEGIN
    -- A job that finished while blocked (cancelled) waits for nothing any more.
    DELETE FROM {schema}.job_waits WHERE job_id = ANY(ids);
    DELETE FROM {schema}.job_deps WHERE job_id = ANY(ids);
    WHILE cardinality(ids) > 0 LOOP
        WITH outcome AS (
            SELECT * FROM unnest(ids, statuses, results) AS o(id, status, result)
        ), edges AS (
            UPDATE {schema}.job_deps AS d
            SET status = o.status, result = CASE WHEN o.status = 'succeeded' THEN o.result END
            FROM outcome AS o
            WHERE d.depends_on = o.id AND d.status IS NULL
            RETURNING d.job_id, o.status
        ), per AS (
            SELECT job_id, count(*)::integer AS n, bool_or(status <> 'succeeded') AS failed
            FROM edges GROUP BY job_id
        ), locked AS (
            SELECT w.job_id, w.on_failure
            FROM {schema}.job_waits AS w
            WHERE w.job_id IN (SELECT job_id FROM per)
            ORDER BY w.job_id
            FOR UPDATE
        ), counted AS (
            UPDATE {schema}.job_waits AS w
            SET remaining = greatest(w.remaining - p.n, 0)
            FROM per AS p, locked AS l
            WHERE w.job_id = p.job_id AND l.job_id = p.job_id
              AND NOT (p.failed AND l.on_failure = 'cancel')
            RETURNING w.job_id, w.remaining
        )
        SELECT coalesce((SELECT array_agg(p.job_id) FROM per AS p JOIN locked AS l USING (job_id)
                         WHERE p.failed AND l.on_failure = 'cancel'), ARRAY[]::bigint[]),
               coalesce((SELECT array_agg(job_id) FROM counted WHERE remaining = 0),
                        ARRAY[]::bigint[])
        INTO failed_ids, ready;

        IF cardinality(ready) > 0 THEN
            -- Released: the results go into the argument that asked for them, then the edges
            -- and the count go, and the workers of each queue are woken at its lowest job.
            WITH passed AS (
                SELECT w.job_id, w.result_arg,
                       CASE WHEN w.result_list
                            THEN (SELECT coalesce(jsonb_agg(coalesce(d.result, 'null'::jsonb)
                                                            ORDER BY d.position), '[]'::jsonb)
                                  FROM {schema}.job_deps AS d WHERE d.job_id = w.job_id)
                            ELSE (SELECT coalesce(d.result, 'null'::jsonb)
                                  FROM {schema}.job_deps AS d WHERE d.job_id = w.job_id
                                  ORDER BY d.position LIMIT 1)
                       END AS value
                FROM {schema}.job_waits AS w
                WHERE w.job_id = ANY(ready)
            ), released AS (
                UPDATE {schema}.jobs AS j
                SET status = CASE WHEN j.run_at > now() THEN 'scheduled' ELSE 'queued' END,
                    args = CASE WHEN p.result_arg IS NULL THEN j.args
                                ELSE j.args || jsonb_build_object(p.result_arg, p.value) END
                FROM passed AS p
                WHERE j.id = p.job_id AND j.status = 'blocked'
                RETURNING j.id, j.queue, j.priority, j.status
            )
            SELECT count({schema}.wake(l.queue, l.priority, l.id))
            INTO n
            FROM (SELECT DISTINCT ON (queue) queue, priority, id FROM released
                  WHERE status = 'queued' ORDER BY queue, priority, id) AS l;
            DELETE FROM {schema}.job_deps WHERE job_id = ANY(ready);
            DELETE FROM {schema}.job_waits WHERE job_id = ANY(ready);
            settled := settled + cardinality(ready);
        END IF;

        -- Cancelled: a dependency did not succeed. They finish here, and what waits for them
        -- is settled in the next round.
        ids := ARRAY[]::bigint[];
        IF cardinality(failed_ids) > 0 THEN
            WITH gone AS (
                DELETE FROM {schema}.jobs AS j
                WHERE j.id = ANY(failed_ids) AND j.status = 'blocked'
                RETURNING j.id, j.queue, j.task, j.args, 'cancelled'::text AS status, j.priority,
                          j.attempt, j.max_attempts, j.run_at, j.created_at, j.started_at,
                          now() AS finished_at, j.worker_id,
                          j.errors || jsonb_build_array(jsonb_build_object(
                              'attempt', j.attempt, 'at', now(), 'kind', 'dependency',
                              'error', 'not run: a job it waits for did not succeed ('
                                       || (SELECT string_agg(d.depends_on || ' ' || d.status, ', '
                                                             ORDER BY d.position)
                                           FROM {schema}.job_deps AS d
                                           WHERE d.job_id = j.id
                                             AND d.status IN ('failed', 'cancelled'))
                                       || ')',
                              'traceback', '')) AS errors,
                          NULL::jsonb AS result, j.dedupe_key, j.retry_of, j.atomic,
                          j.concurrency_key, j.workflow_id, j.progress, j.tags
            ), archived AS (
                INSERT INTO {schema}.job_history
                    (id, queue, task, args, status, priority, attempt, max_attempts, run_at,
                     created_at, started_at, finished_at, worker_id, errors, result, dedupe_key,
                     retry_of, atomic, concurrency_key, workflow_id, progress, tags)
                SELECT * FROM gone WHERE keep_history
                RETURNING id
            )
            SELECT coalesce(array_agg(id), ARRAY[]::bigint[]) INTO ids FROM gone;
            DELETE FROM {schema}.job_deps WHERE job_id = ANY(ids);
            DELETE FROM {schema}.job_waits WHERE job_id = ANY(ids);
            statuses := array_fill('cancelled'::text, ARRAY[cardinality(ids)]);
            results := array_fill(NULL::jsonb, ARRAY[cardinality(ids)]);
            settled := settled + cardinality(ids);
        END IF;
    END LOOP;
    RETURN settled;
END
$$;
