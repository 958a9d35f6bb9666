-- Durable execution: the steps a job recorded (sql/migrations/0028_durable.sql), and the
-- transactions an atomic job's steps commit in (pgqueue/worker/durable.py).

-- name: job_steps_read
-- The steps a job recorded, in order, each with the database's clock now (a sleep compares
-- its end with it); one row with a NULL seq when the job recorded none.
SELECT s.seq, s.name, s.kind, s.result, c.now
FROM (SELECT clock_timestamp() AS now) AS c
LEFT JOIN {schema}.job_steps AS s ON s.job_id = %(job_id)s
ORDER BY s.seq;

-- name: job_step_record
-- Records step `seq` of a job, with its result, or for a sleep (`sleep_seconds` given) the
-- time it ends, by the database's clock. Guard: only while the job is still running this
-- attempt for this worker, so a worker that lost its job (rescued after its lease lapsed)
-- records nothing. The guard locks the job's row (FOR SHARE): a rescue racing the record
-- waits for it to commit, and the next attempt reads it; or the record waits for the rescue
-- and then finds the job moved. A step already recorded is kept (ON CONFLICT DO NOTHING):
-- the caller then reads it with job_step_read. Returns the recorded result and the
-- database's clock. The running guard compares with a value the planner does not know, as
-- job_step_record_many's does, so that no cached plan walks the partial index
-- jobs_running_idx (a worker's running jobs, and under a long transaction their dead entries)
-- instead of probing the primary key.
INSERT INTO {schema}.job_steps AS s (job_id, seq, name, kind, result, started_at, finished_at)
SELECT %(job_id)s, %(seq)s, %(name)s, %(kind)s,
       coalesce(%(result)s::jsonb,
                jsonb_build_object('until', e.ends, 'until_epoch', extract(epoch FROM e.ends))),
       %(started_at)s, clock_timestamp()
FROM (SELECT clock_timestamp() + make_interval(secs => %(sleep_seconds)s::float8) AS ends) AS e
WHERE EXISTS (
    SELECT 1 FROM {schema}.jobs AS j
    WHERE j.id = %(job_id)s AND j.status = (SELECT 'running'::text)
      AND j.worker_id = %(worker_id)s
      AND j.attempt = %(attempt)s
    FOR SHARE
)
ON CONFLICT (job_id, seq) DO NOTHING
RETURNING s.result, s.finished_at;

-- name: job_step_record_segment
-- Records step `seq` of an atomic job in the segment that commits it, as job_step_record
-- does (its result, or a sleep's end by the database's clock), sent in one round trip with
-- the segment's end and the next one's start (pgqueue/store/steps.py). No guard: the segment
-- holds the job's row lock, taken by its claim or by job_segment_lock, so the job is this
-- worker's until the commit. No ON CONFLICT: the attempt read its steps under that lock and
-- nothing else records for the job meanwhile, so a step already at this place is an error,
-- and the segment does not commit.
INSERT INTO {schema}.job_steps AS s (job_id, seq, name, kind, result, started_at, finished_at)
SELECT %(job_id)s, %(seq)s, %(name)s, %(kind)s,
       coalesce(%(result)s::jsonb,
                jsonb_build_object('until', e.ends, 'until_epoch', extract(epoch FROM e.ends))),
       %(started_at)s, clock_timestamp()
FROM (SELECT clock_timestamp() + make_interval(secs => %(sleep_seconds)s::float8) AS ends) AS e
RETURNING s.result, s.finished_at;

-- name: job_step_record_many
-- Records a batch of steps, one per element of the arrays (a lease worker group-commits the
-- steps its jobs reach together: pgqueue/worker/checkpoints.py), as job_step_record does one:
-- its result, or for a sleep (its `sleep_seconds` not NULL) the time it ends by the database's
-- clock. Guard, per record: only while its job is still running that attempt for that worker,
-- so a record whose job was moved (rescued after the lease lapsed) is left out and the others
-- go in. The guard locks the jobs' rows (FOR SHARE) in id order, like every
-- statement that locks several jobs, so two never deadlock: a rescue racing the batch waits
-- for it to commit, and the next attempt reads the records; or the batch waits for the rescue
-- and then finds that job moved (its row is checked again once locked). Steps already
-- recorded are kept (ON CONFLICT DO NOTHING). Returns the records that went in; the caller
-- reads the others with job_step_read. The running guard compares with a value the planner
-- does not know, as job_finish_many does, so it never walks the partial index jobs_running_idx.
WITH r AS MATERIALIZED (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(worker_ids)s::bigint[], %(attempts)s::integer[],
                %(seqs)s::integer[], %(names)s::text[], %(kinds)s::text[], %(results)s::text[],
                %(sleep_seconds)s::float8[], %(started_ats)s::timestamptz[])
         AS r(job_id, worker_id, attempt, seq, name, kind, result, sleep_seconds, started_at)
), ours AS MATERIALIZED (
    SELECT j.id, j.worker_id, j.attempt
    FROM {schema}.jobs AS j
    WHERE j.id = ANY(%(job_ids)s::bigint[]) AND j.status = (SELECT 'running'::text)
      AND j.worker_id = ANY(%(worker_ids)s::bigint[])
    ORDER BY j.id
    FOR SHARE OF j
)
INSERT INTO {schema}.job_steps AS s (job_id, seq, name, kind, result, started_at, finished_at)
SELECT r.job_id, r.seq, r.name, r.kind,
       coalesce(r.result::jsonb,
                jsonb_build_object('until', e.ends, 'until_epoch', extract(epoch FROM e.ends))),
       r.started_at, clock_timestamp()
FROM r
JOIN ours ON ours.id = r.job_id AND ours.worker_id = r.worker_id AND ours.attempt = r.attempt
CROSS JOIN LATERAL (
    SELECT clock_timestamp() + make_interval(secs => r.sleep_seconds) AS ends
) AS e
ON CONFLICT (job_id, seq) DO NOTHING
RETURNING s.job_id, s.seq, s.result, s.finished_at;

-- name: job_step_read
-- One recorded step: its name, kind and result (after job_step_record found it taken).
SELECT name, kind, result, clock_timestamp() FROM {schema}.job_steps
WHERE job_id = %(job_id)s AND seq = %(seq)s;

-- name: job_segment_begin
-- Opens the transaction of an atomic job's next segment: what its handler writes until its
-- next step, and that step's record, commit together in it.
BEGIN;

-- name: job_segment_lock
-- Locks an atomic job's row again at the start of a segment. Between segments the job is
-- committed as running for this worker, guarded by the worker's lease like a lease job;
-- this finds no row once the job is no longer ours (rescued after the lease lapsed). The
-- status is compared with a value the planner does not know, as in job_step_record.
SELECT id FROM {schema}.jobs
WHERE id = %(job_id)s AND status = (SELECT 'running'::text) AND worker_id = %(worker_id)s
  AND attempt = %(attempt)s
FOR UPDATE;

-- name: job_segment_savepoint
-- Marks where the handler's writes of the segment start.
SAVEPOINT pgqueue_segment;

-- name: job_segment_discard
-- Rolls back what the handler wrote in this segment, keeping the claim; the savepoint stays.
ROLLBACK TO SAVEPOINT pgqueue_segment;

-- name: job_segment_release
-- Keeps what the handler wrote in this segment, in the transaction.
RELEASE SAVEPOINT pgqueue_segment;

-- name: job_segment_commit
-- Commits a segment: the handler's writes, the step's record, the claim.
COMMIT;

-- name: job_steps_list
-- The steps a job recorded, in order, whole, for people (Queue.job_steps, the dashboard,
-- `pgqueue jobs show`). An index range of the steps' primary key.
SELECT seq, name, kind, result, started_at, finished_at
FROM {schema}.job_steps
WHERE job_id = %(job_id)s
ORDER BY seq;

-- name: job_waits_read
-- Of the given jobs, those waiting as scheduled jobs on a durable call, and what for: the
-- signal a job is parked for (its key, timeout and since when), or the end of the sleep its
-- last step recorded, while that is still ahead. One row per such job; one probe of each
-- job's row, its wait and its last step by primary key, so a page of jobs reads a page's
-- worth (the dashboard's jobs list shows them in one statement).
SELECT j.id, w.key AS waiting_for, w.until AS waiting_until, w.since AS waiting_since,
       z.until AS sleeping_until
FROM {schema}.jobs AS j
LEFT JOIN {schema}.signal_waits AS w ON w.job_id = j.id
LEFT JOIN LATERAL (
    SELECT CASE WHEN l.kind = 'sleep' THEN (l.result ->> 'until')::timestamptz END AS until
    FROM {schema}.job_steps AS l
    WHERE l.job_id = j.id
    ORDER BY l.seq DESC
    LIMIT 1
) AS z ON true
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = 'scheduled'
  AND (w.job_id IS NOT NULL OR z.until > coalesce(%(now)s::timestamptz, now()));
