-- 0015: wake-ups only for workers that wait for them.
--
-- Every transaction that calls pg_notify takes one database-wide lock while it commits, so
-- notifying commits run one at a time; with many connections enqueueing, that lock becomes
-- the application's commit bottleneck. Most of those notices are wasted: a worker whose
-- slots are all busy claims again as soon as one frees, and finds new jobs then.
--
-- So each listening worker says, per queue it serves, which wake-ups it does not need: those
-- for jobs with a priority from `below` to `above`, which its next claim finds anyway. While
-- it waits for work the range is empty (below 32768: it wants every notice); while every
-- slot is busy it is the range its claim hint covers (pgqueue/interest.py). wake() notifies
-- only when some worker wants the notice. A worker that polls only writes no row.
--
-- The check reads the table with a fresh snapshot, which only READ COMMITTED gives a
-- function's statements; under REPEATABLE READ or SERIALIZABLE the snapshot may predate a
-- worker's row, so wake() notifies regardless. The one race left (an enqueue that checked
-- before a worker widened its row and commits after the worker's next claim) is closed by the
-- worker: after widening it claims from the floor once the transactions that were then in
-- progress have ended (pgqueue/worker.py).
--
-- Rows go with their worker's row (a worker presumed dead and revived writes them again).
-- wake() runs as its caller, as it did: an enqueuing role reads the table (granted below and
-- by `pgqueue grant --kind app`); running as the owner cost each enqueue more.
CREATE TABLE {schema}.wake_listeners (
    worker_id bigint   NOT NULL REFERENCES {schema}.workers (id) ON DELETE CASCADE,
    queue     text     NOT NULL,
    below     integer  NOT NULL,
    above     integer  NOT NULL,
    PRIMARY KEY (worker_id, queue)
);

-- The check reads a queue's rows, one per worker serving it, from this index alone.
CREATE INDEX wake_listeners_queue_idx ON {schema}.wake_listeners (queue, below, above);

CREATE OR REPLACE FUNCTION {schema}.wake(queue text, priority integer, id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (
           SELECT 1 FROM {schema}.wake_listeners AS l
           WHERE l.queue = wake.queue AND (wake.priority < l.below OR wake.priority > l.above)
       ) THEN
        RETURN;
    END IF;
    PERFORM pg_notify({wake_channel}, concat_ws(' ', wake.queue, wake.priority, wake.id));
END
$$;

-- The roles of an existing installation get the table too (`pgqueue grant` grants it on new
-- ones): every role that may register workers may say what they want, and every role that
-- may enqueue may read it.
DO $$
DECLARE
    found record;
BEGIN
    FOR found IN
        SELECT DISTINCT a.grantee,
               CASE WHEN c.relname = 'workers' THEN 'SELECT, INSERT, UPDATE'
                    ELSE 'SELECT' END AS privileges
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid IN ('{schema}.workers'::regclass, '{schema}.jobs'::regclass)
          AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.wake_listeners TO %s', found.privileges,
                       CASE WHEN found.grantee = 0 THEN 'PUBLIC'
                            ELSE found.grantee::regrole::text END);
    END LOOP;
END
$$;
