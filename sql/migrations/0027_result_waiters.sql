-- 0027: a finished job tells whoever waits for its result, and nobody else.
--
-- Queue.wait (pgqueue/queue/waiting.py) registers the jobs it waits for here, one row per job and
-- listening session; the statements that finish jobs call notify_waiters() with the ids they
-- finished, which sends the job's id on the schema's done channel for those that have a row.
-- A finish nobody waits for costs one probe of this table's index, which is empty or small:
-- no NOTIFY, and with it no share of the commit lock that every notifying commit takes.
-- NOTIFY is transactional: the waiter hears of the job at the finish's commit, when the
-- outcome it reads is there to read.
--
-- A row belongs to the session that LISTENs (pid, backend_start): it is deleted when its wait
-- ends, and rows whose session is gone (a process that died while waiting) are swept by the
-- next waiter that connects (wait_sweep in sql/queries/waits.sql). A row left behind only
-- costs a notice nobody hears. The waiter polls as well, so a notice lost to the one race
-- left (a finish whose snapshot predates the row and commits after the waiter read the job),
-- or to a connection that cannot LISTEN, delays a result and never loses it.
CREATE TABLE {schema}.result_waiters (
    job_id        bigint      NOT NULL,
    pid           integer     NOT NULL,
    backend_start timestamptz NOT NULL,
    PRIMARY KEY (job_id, pid)
);

-- The payload is the job's id; pgqueue/queue/waiting.py is its one parser. notify_waiters() runs as
-- its caller, like wake(): every role that finishes or cancels jobs reads this table.
CREATE FUNCTION {schema}.notify_waiters(ids bigint[]) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    told bigint;
BEGIN
    SELECT count(pg_notify({done_channel}, w.job_id::text)) INTO told
    FROM (SELECT DISTINCT r.job_id FROM {schema}.result_waiters AS r
          WHERE r.job_id = ANY(notify_waiters.ids)) AS w;
    RETURN told;
END
$$;

-- The roles of an existing installation get the table too (`pgqueue grant` grants it on new
-- ones): every role that may enqueue or move jobs may wait for them, and read who waits.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.jobs'::regclass
          AND a.privilege_type IN ('INSERT', 'DELETE') AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON {schema}.result_waiters TO %s',
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
