-- The django.tasks backend's own statements (pgqueue/contrib/django/tasks.py).

-- name: job_keep_first_start
-- Stores when a django.tasks job's first attempt started in its stored arguments, since the
-- row's started_at is the latest attempt's and Django's TaskResult.started_at is the first's.
-- Only while this worker runs attempt 1: a late write cannot touch a job that moved on. The
-- status is compared with a value the planner does not know, so that no cached plan walks
-- the partial index jobs_running_idx instead of probing the primary key.
UPDATE {schema}.jobs
SET args = args || jsonb_build_object('started_at', %(started_at)s::text)
WHERE id = %(id)s AND status = (SELECT 'running'::text) AND attempt = 1
  AND worker_id = %(worker_id)s;
