-- 0028: durable execution inside tasks: the steps a job recorded, and signals.
--
-- A handler that takes a JobContext may run its work as named steps (ctx.step), sleep
-- (ctx.sleep) and wait for a signal (ctx.wait_for_signal). Each of these records a row here,
-- numbered in the order the handler reached it; when the job runs again (a retry, a rescue, the
-- end of a sleep) the handler is replayed and each recorded call returns what it recorded
-- instead of running again (pgqueue/worker/durable.py).
--
-- The rows are keyed by job id, with no foreign key: a job moves from `jobs` to `job_history`
-- when it finishes and keeps its steps there for the dashboard to show; retention deletes
-- the steps of jobs that are in neither table (sql/queries/history.sql, job_steps_prune).
CREATE TABLE {schema}.job_steps (
    job_id      bigint      NOT NULL,
    seq         integer     NOT NULL CONSTRAINT seq_counts_from_one CHECK (seq > 0),
    name        text        NOT NULL,
    kind        text        NOT NULL
        CONSTRAINT kind_is_step_sleep_or_signal CHECK (kind IN ('step', 'sleep', 'signal')),
    result      jsonb,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, seq)
);

-- Signals sent and not yet taken by a job, oldest first per key. A signal is inserted in the
-- sender's transaction, so it exists only if that transaction commits; a job takes it by
-- deleting it in the same statement that records it as one of its steps: once, and only once.
CREATE TABLE {schema}.signals (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key     text        NOT NULL,
    payload jsonb,
    sent_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX signals_key_idx ON {schema}.signals (key, id);

-- Jobs parked until a signal for `key` arrives, or until `until` (their timeout). The job
-- itself waits as a scheduled job whose run_at is that timeout; sending a signal sets the
-- oldest waiter for its key back to queued (sql/queries/signals.sql, signal_send).
CREATE TABLE {schema}.signal_waits (
    job_id bigint      PRIMARY KEY,
    key    text        NOT NULL,
    seq    integer     NOT NULL,
    until  timestamptz,
    since  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX signal_waits_key_idx ON {schema}.signal_waits (key, since);

-- Sends a signal: stores it and wakes the oldest job parked for its key, which goes back to
-- queued now, its workers told at commit (wake(), as job_insert). In the caller's transaction:
-- nothing of it is seen before the caller commits, and nothing at all if it rolls back. It
-- first takes the key's lock (sql/queries/signals.sql, signal_lock), held until the caller's
-- transaction ends, and the statement after it reads with a snapshot taken once the lock is
-- held: a job parking for the key meanwhile either committed its wait before (and is woken
-- here) or parks after this commits (and sees the signal). It runs as its owner, so a role
-- that only enqueues may send signals without the right to move jobs itself.
CREATE FUNCTION {schema}.signal_send(signal_key text, signal_payload jsonb) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sent_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgqueue.signal'),
                                  hashtext({schema_name} || '/' || signal_key));
    WITH sent AS (
        INSERT INTO {schema}.signals (key, payload) VALUES (signal_key, signal_payload)
        RETURNING id
    ), waiter AS (
        SELECT w.job_id FROM {schema}.signal_waits AS w
        JOIN {schema}.jobs AS j ON j.id = w.job_id AND j.status = 'scheduled'
        WHERE w.key = signal_key
        ORDER BY w.since, w.job_id
        LIMIT 1
    ), woken AS (
        UPDATE {schema}.jobs AS j
        SET status = 'queued', run_at = now()
        FROM waiter
        WHERE j.id = waiter.job_id AND j.status = 'scheduled'
        RETURNING j.queue, j.priority, j.id
    )
    SELECT (SELECT id FROM sent) INTO sent_id
    FROM (SELECT count({schema}.wake(queue, priority, id)) AS n FROM woken) AS told;
    RETURN sent_id;
END
$$;

-- The roles of an existing installation that move jobs (workers) get the tables too
-- (`pgqueue grant` grants them on new ones); any role may call signal_send.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.jobs'::regclass
          AND a.privilege_type = 'DELETE' AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.job_steps, '
                       '{schema}.signals, {schema}.signal_waits TO %s',
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
