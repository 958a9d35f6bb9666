-- 0016: job_history partitioned by the day of finished_at, so that retention drops whole days
-- (DROP TABLE: no DELETE, no dead tuples, no VACUUM) instead of deleting rows in batches.
--
-- The migration itself takes no time whatever the history holds: the existing table becomes
-- the partitioned table's DEFAULT partition (with no other partition yet, attaching it checks
-- no row), and the parent gets the same indexes, which the existing table's own indexes
-- satisfy. Daily partitions, and the move of the existing rows out of the default position,
-- are then made step by step by history_partitions_step(), which every worker calls
-- (pgqueue/partitions.py), each step its own short transaction:
--   1. the old rows are sealed: a CHECK (finished_at < the day after tomorrow) NOT VALID,
--      which only takes the table's lock for an instant (and if the next steps have not
--      succeeded by the day before that bound, the seal is dropped and made again further
--      on, so that no row is ever refused);
--   2. the check is validated, a scan that blocks no reader and no writer;
--   3. the old table is moved from DEFAULT to the range below that day (the valid check
--      spares the scan), and an empty default takes its place;
--   4. one partition per day is made ahead, and retention drops those past the cutoff.
-- A new installation's default is empty, so it goes straight to step 4. Rows whose day has
-- no partition yet land in the default and are never refused; retention deletes them in
-- batches as before.
--
-- Each partition has its own primary key on id (the old table keeps its own): a key across
-- partitions would have to include finished_at, and nothing needs one, since a job's id is
-- unique in the jobs table it comes from. get_job and list_jobs look up every partition's
-- id index.

ALTER TABLE {schema}.job_history RENAME TO job_history_legacy;
ALTER INDEX {schema}.job_history_pkey RENAME TO job_history_legacy_pkey;
ALTER INDEX {schema}.job_history_finished_idx RENAME TO job_history_legacy_finished_idx;
ALTER INDEX {schema}.job_history_dedupe_key_idx RENAME TO job_history_legacy_dedupe_key_idx;
ALTER INDEX {schema}.job_history_queue_status_idx RENAME TO job_history_legacy_queue_status_idx;
ALTER INDEX {schema}.job_history_workflow_idx RENAME TO job_history_legacy_workflow_idx;

CREATE TABLE {schema}.job_history (
    LIKE {schema}.job_history_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE
) PARTITION BY RANGE (finished_at);

CREATE INDEX job_history_finished_idx ON {schema}.job_history (finished_at);
CREATE INDEX job_history_dedupe_key_idx ON {schema}.job_history (dedupe_key, finished_at)
    WHERE dedupe_key IS NOT NULL;
CREATE INDEX job_history_queue_status_idx
    ON {schema}.job_history (queue, status, finished_at, id);
CREATE INDEX job_history_workflow_idx ON {schema}.job_history (workflow_id)
    WHERE workflow_id IS NOT NULL;

ALTER TABLE {schema}.job_history ATTACH PARTITION {schema}.job_history_legacy DEFAULT;

-- The roles that could read or write the old table get the same on the new one.
DO $$
DECLARE
    grant_row record;
BEGIN
    FOR grant_row IN
        SELECT a.grantee, a.privilege_type
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.job_history_legacy'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON {schema}.job_history TO %s', grant_row.privilege_type,
                       CASE WHEN grant_row.grantee = 0 THEN 'PUBLIC'
                            ELSE grant_row.grantee::regrole::text END);
    END LOOP;
END
$$;

-- A partition's upper bound, from its catalog entry; NULL for the default.
CREATE FUNCTION {schema}.history_partition_end(partition regclass) RETURNS timestamptz
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz
    FROM pg_class AS c WHERE c.oid = partition
$$;

-- One step of the partitioning's upkeep (see the top of this file); what it did, or NULL when
-- there was nothing to do. Runs as its owner, so that a worker's role needs no DDL right;
-- only the roles granted EXECUTE (`pgqueue grant --kind worker`) may call it. A lock it cannot
-- get within lock_ms is an error, and the caller tries again later: waiting longer would
-- queue every finishing job behind it.
CREATE FUNCTION {schema}.history_partitions_step(ahead integer, lock_ms integer)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET TimeZone = 'UTC'  -- the bounds it writes and the times it reports, whatever the session's
AS $$
DECLARE
    parent constant regclass := '{schema}.job_history'::regclass;
    fallback regclass;
    sealed_until timestamptz;
    sealed_valid boolean;
    first_day timestamptz;
    day timestamptz;
    part text;
BEGIN
    -- One worker at a time: the others find the lock taken and leave it to that one.
    IF NOT pg_try_advisory_xact_lock(hashtext('pgqueue.partitions'), hashtext({schema_name})) THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
    SELECT i.inhrelid::regclass INTO fallback
    FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
    WHERE i.inhparent = parent AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT';
    IF fallback IS NULL THEN
        CREATE TABLE {schema}.job_history_default PARTITION OF {schema}.job_history DEFAULT;
        RETURN 'made the default partition';
    END IF;
    IF fallback = to_regclass('{schema}.job_history_legacy') THEN
        IF NOT EXISTS (SELECT 1 FROM {schema}.job_history_legacy) THEN
            ALTER TABLE {schema}.job_history_legacy RENAME TO job_history_default;
            FOR part IN
                SELECT c.relname FROM pg_index AS x JOIN pg_class AS c ON c.oid = x.indexrelid
                WHERE x.indrelid = '{schema}.job_history_default'::regclass
            LOOP
                EXECUTE format('ALTER INDEX {schema}.%I RENAME TO %I', part,
                               replace(part, 'job_history_legacy', 'job_history_default'));
            END LOOP;
            RETURN 'the empty history table is the default partition';
        END IF;
        SELECT substring(pg_get_constraintdef(k.oid) FROM '''([^'']+)''')::timestamptz,
               k.convalidated
        INTO sealed_until, sealed_valid
        FROM pg_constraint AS k
        WHERE k.conrelid = fallback AND k.conname = 'job_history_legacy_sealed';
        IF sealed_until IS NULL THEN
            sealed_until := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                            + interval '2 days';
            EXECUTE format('ALTER TABLE {schema}.job_history_legacy ADD CONSTRAINT '
                           'job_history_legacy_sealed CHECK (finished_at < %L) NOT VALID',
                           sealed_until);
            RETURN format('sealed the existing history below %s', sealed_until);
        END IF;
        IF sealed_until < now() + interval '1 day' THEN
            -- The steps after the seal have failed for a day (a lock never had in time): rows
            -- past the bound would soon be refused. Seal again, further on.
            ALTER TABLE {schema}.job_history_legacy DROP CONSTRAINT job_history_legacy_sealed;
            RETURN format('the seal below %s was about to pass: dropped, to seal again',
                          sealed_until);
        END IF;
        IF NOT sealed_valid THEN
            ALTER TABLE {schema}.job_history_legacy VALIDATE CONSTRAINT job_history_legacy_sealed;
            RETURN 'checked the existing history';
        END IF;
        ALTER TABLE {schema}.job_history DETACH PARTITION {schema}.job_history_legacy;
        EXECUTE format('ALTER TABLE {schema}.job_history ATTACH PARTITION '
                       '{schema}.job_history_legacy FOR VALUES FROM (MINVALUE) TO (%L)',
                       sealed_until);
        CREATE TABLE {schema}.job_history_default PARTITION OF {schema}.job_history DEFAULT;
        RETURN format('the existing history is the partition below %s', sealed_until);
    END IF;
    -- Daily partitions from today (or the end of the ranges already made) to `ahead` days on.
    -- A day whose rows already went to the default (no partition was made in time) is left
    -- there, or the partition could not be attached; retention deletes those rows in batches.
    SELECT max({schema}.history_partition_end(i.inhrelid)) INTO first_day
    FROM pg_inherits AS i WHERE i.inhparent = parent;
    day := greatest(coalesce(first_day, '-infinity'),
                    date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC');
    LOOP
        IF day >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                  + make_interval(days => ahead) THEN
            RETURN NULL;
        END IF;
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM {schema}.job_history_default
            WHERE finished_at >= day AND finished_at < day + interval '1 day'
        );
        day := day + interval '1 day';
    END LOOP;
    part := 'job_history_' || to_char(day AT TIME ZONE 'UTC', 'YYYYMMDD');
    EXECUTE format('CREATE TABLE {schema}.%I (LIKE {schema}.job_history INCLUDING DEFAULTS '
                   'INCLUDING CONSTRAINTS INCLUDING STORAGE)', part);
    EXECUTE format('ALTER TABLE {schema}.%I ADD PRIMARY KEY (id)', part);
    EXECUTE format('ALTER TABLE {schema}.job_history ATTACH PARTITION {schema}.%I '
                   'FOR VALUES FROM (%L) TO (%L)', part, day, day + interval '1 day');
    RETURN format('made partition %s', part);
END
$$;

-- Drops the partitions whose every row finished before `cutoff`: whole days of history at
-- once, and the old table once its range has passed. Returns each partition dropped with its
-- estimated rows. Same rights and lock bound as history_partitions_step.
CREATE FUNCTION {schema}.history_partitions_drop(cutoff timestamptz, lock_ms integer)
RETURNS TABLE (partition text, estimated_rows bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgqueue.partitions'), hashtext({schema_name})) THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', lock_ms || 'ms', true);
    FOR found IN
        SELECT c.oid::regclass AS part, c.relname, greatest(c.reltuples, 0)::bigint AS est
        FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.job_history'::regclass
          AND {schema}.history_partition_end(c.oid) <= cutoff
        ORDER BY {schema}.history_partition_end(c.oid)
    LOOP
        EXECUTE format('DROP TABLE %s', found.part);
        partition := found.relname;
        estimated_rows := found.est;
        RETURN NEXT;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION {schema}.history_partitions_step(integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.history_partitions_drop(timestamptz, integer) FROM PUBLIC;

-- Roles that can register workers may keep the partitions (new ones: `pgqueue grant`).
DO $$
DECLARE
    grantee oid;
BEGIN
    FOR grantee IN
        SELECT DISTINCT a.grantee
        FROM pg_class AS c CROSS JOIN aclexplode(c.relacl) AS a
        WHERE c.oid = '{schema}.workers'::regclass AND a.privilege_type = 'INSERT'
          AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.history_partitions_step(integer, '
                       'integer), {schema}.history_partitions_drop(timestamptz, integer) TO %s',
                       grantee::regrole::text);
    END LOOP;
END
$$;
