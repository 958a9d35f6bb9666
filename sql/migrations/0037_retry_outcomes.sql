-- 0037: the outcome writes put retried jobs back in a function, called only for a batch
-- that has some.
--
-- job_finish_many held the retry branch as an UPDATE of jobs in the statement itself. An
-- UPDATE opens every index of its table when the statement starts, whether or not it moves a
-- row, so every batch paid for it, most of them with no retry at all; for the small batches
-- of a worker keeping up with a stream of jobs that was about a third of the statement's
-- time. The same UPDATE and wake-ups as before, with the same guard: a job moves only while
-- it is still running this attempt for the worker named in its outcome, and a retry of a job
-- whose cancellation was requested is left to the statement, which ends it as cancelled. The
-- running guard compares with a value the planner does not know, as the statement's does, so
-- the plan the session keeps cannot read jobs_running_idx (test_finish_batch_plan.py).
CREATE FUNCTION {schema}.retry_outcomes(
    outcomes jsonb, ids bigint[], now_ timestamptz, OUT retried bigint, OUT woken bigint
)
LANGUAGE plpgsql
AS $$
BEGIN
    WITH moved AS (
        UPDATE {schema}.jobs AS j
        SET status = CASE WHEN (outcomes -> j.id::text ->> 'retry_in')::float8 > 0
                          THEN 'scheduled' ELSE 'queued' END,
            run_at = coalesce(now_, now())
                     + make_interval(secs => (outcomes -> j.id::text ->> 'retry_in')::float8),
            worker_id = NULL,
            -- A snooze gives its attempt back and records no error.
            attempt = CASE WHEN (outcomes -> j.id::text -> 'snooze') = 'true'
                           THEN j.attempt - 1 ELSE j.attempt END,
            errors = CASE WHEN nullif(outcomes -> j.id::text -> 'error', 'null') IS NULL
                          THEN j.errors
                          ELSE j.errors || jsonb_build_array(outcomes -> j.id::text -> 'error')
                     END
        WHERE j.id = ANY(ids) AND j.status = (SELECT 'running'::text)
          AND j.attempt = (outcomes -> j.id::text ->> 'attempt')::integer
          AND j.worker_id = (outcomes -> j.id::text ->> 'worker_id')::bigint
          AND outcomes -> j.id::text ->> 'status' = 'retry'
          AND j.cancel_requested_at IS NULL
        RETURNING j.id, j.queue, j.priority, j.status
    ), woke AS (
        SELECT count({schema}.wake(l.queue, l.priority, l.id)) AS n
        FROM (SELECT DISTINCT ON (m.queue) m.queue, m.priority, m.id FROM moved AS m
              WHERE m.status = 'queued' ORDER BY m.queue, m.priority, m.id) AS l
    )
    SELECT (SELECT count(*) FROM moved), (SELECT n FROM woke) INTO retried, woken;
END
$$;
