-- What an operator needs to see: per-queue counts, what holds back the xmin horizon, and how
-- VACUUM keeps up with the hot jobs table. A long transaction anywhere in the database stops
-- VACUUM from removing the jobs table's dead rows, and claims slow down ("Postgres Job Queues &
-- Failure By MVCC"). Everything here only reads, except session_terminate_holder.

-- name: queue_list_stats
-- Per-queue counts: live jobs from the hot table, failures and throughput from the last hour of
-- history, and how long the oldest queued job has been due. `waiting` counts jobs parked
-- because their concurrency key is at its limit: they run only as the key's slots free up;
-- `paused`, whether the queue is paused (pgqueue queues pause); `blocked`, workflow jobs
-- waiting for the jobs they depend on. A queue appears if it has live
-- jobs or finished any in the last hour. The history window is (now - 1 hour, now], so an injected
-- now in the past counts only what had finished by then; it walks job_history_finished_idx.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'waiting') AS waiting,
           count(*) FILTER (WHERE status = 'blocked') AS blocked,
           min(run_at) FILTER (WHERE status = 'queued') AS oldest_queued_run_at
    FROM {schema}.jobs
    GROUP BY queue
), recent AS (
    SELECT h.queue,
           count(*) FILTER (WHERE h.status = 'failed') AS failed_last_hour,
           count(*) FILTER (WHERE h.status = 'succeeded'
                              AND h.finished_at > c.now - interval '1 minute')
               AS succeeded_last_minute,
           count(*) FILTER (WHERE h.status = 'succeeded') AS succeeded_last_hour
    FROM {schema}.job_history AS h
    CROSS JOIN clock AS c
    WHERE h.finished_at > c.now - interval '1 hour' AND h.finished_at <= c.now
    GROUP BY h.queue
)
SELECT queue,
       coalesce(l.queued, 0) AS queued,
       coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.running, 0) AS running,
       coalesce(l.waiting, 0) AS waiting,
       coalesce(r.failed_last_hour, 0) AS failed_last_hour,
       coalesce(r.succeeded_last_minute, 0) AS succeeded_last_minute,
       coalesce(r.succeeded_last_hour, 0) AS succeeded_last_hour,
       c.now - l.oldest_queued_run_at AS oldest_queued_age,
       EXISTS (SELECT FROM {schema}.queue_pauses AS p
               WHERE p.queue = coalesce(l.queue, r.queue)) AS paused,
       coalesce(l.blocked, 0) AS blocked
FROM live AS l
FULL JOIN recent AS r USING (queue)
CROSS JOIN clock AS c
ORDER BY queue;

-- name: horizon_list_holders
-- Everything that holds back the xmin horizon of this database, oldest xid first: sessions with
-- a snapshot (backend_xmin) or a transaction id (backend_xid), replication slots with xmin or
-- catalog_xmin, and prepared transactions. Sessions of other databases are left out: they do
-- not hold back this database's tables (walsenders, with no database, stay in). The current
-- backend is never listed. Slots have no start time, so their age is NULL and a min_age leaves
-- them out. `terminable` repeats the guard of session_terminate_holder: only client backends
-- of this database that are not pgqueue's own connections (application_name 'pgqueue:...',
-- set in pgqueue/link.py) may be terminated.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), holder AS (
    SELECT 'session' AS kind, a.pid, NULL::text AS name, a.usename::text AS usename,
           a.application_name, a.backend_type, a.state, a.xact_start,
           c.now - a.xact_start AS age, c.now - a.state_change AS state_age,
           left(a.query, 200) AS query,
           greatest(age(a.backend_xmin), age(a.backend_xid)) AS xmin_age,
           NULL::integer AS catalog_xmin_age,
           a.backend_type = 'client backend'
               AND NOT starts_with(coalesce(a.application_name, ''), 'pgqueue:') AS terminable
    FROM pg_stat_activity AS a
    CROSS JOIN clock AS c
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
      AND a.pid <> pg_backend_pid()
      AND (a.datname IS NULL OR a.datname = current_database())
    UNION ALL
    SELECT 'replication_slot', s.active_pid, s.slot_name::text, NULL, NULL, s.slot_type,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, NULL, NULL, NULL,
           age(s.xmin), age(s.catalog_xmin), false
    FROM pg_replication_slots AS s
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared_xact', NULL, p.gid, p.owner::text, NULL, NULL, 'prepared', p.prepared,
           c.now - p.prepared, NULL, NULL, age(p.transaction), NULL, false
    FROM pg_prepared_xacts AS p
    CROSS JOIN clock AS c
    WHERE p.database = current_database()
)
SELECT *
FROM holder
WHERE %(min_age)s::interval IS NULL OR age >= %(min_age)s::interval
ORDER BY greatest(xmin_age, catalog_xmin_age) DESC NULLS LAST, age DESC NULLS LAST, pid;

-- name: session_terminate_holder
-- Terminates one session that holds the horizon, waiting up to %(wait_ms)s for it to exit.
-- Guard, re-checked at the moment of the kill: never this backend, never one of pgqueue's own
-- connections, only a client backend of this database whose transaction still holds the
-- horizon and began at least %(min_age)s ago. So a session that ended its old transaction after
-- the report was read is spared, and so is a new backend that reused the pid (its transaction
-- is younger than the report). No row: the guard refused.
SELECT pg_terminate_backend(a.pid, %(wait_ms)s::bigint) AS terminated
FROM pg_stat_activity AS a
WHERE a.pid = %(pid)s::integer
  AND a.pid <> pg_backend_pid()
  AND a.backend_type = 'client backend'
  AND NOT starts_with(coalesce(a.application_name, ''), 'pgqueue:')
  AND a.datname = current_database()
  AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
  AND a.xact_start <= coalesce(%(now)s::timestamptz, now()) - %(min_age)s::interval;

-- name: table_read_health
-- Dead and live row estimates and the last (auto)vacuum and analyze of one table, matched by
-- name as a value (no identifier is built). Dead rows that keep growing while autovacuum runs
-- mean something holds the horizon. No row: the table does not exist or has no statistics yet.
SELECT schemaname AS schema_name, relname AS table_name, n_live_tup, n_dead_tup,
       last_vacuum, last_autovacuum, last_autoanalyze
FROM pg_stat_user_tables
WHERE schemaname = %(schema)s AND relname = %(table)s;

-- name: queue_read_depth
-- What a metrics scrape reads of the queues: live jobs per queue and status, and how long the
-- oldest queued job of each queue has been due. Reads the hot table only, never history, so a
-- scrape costs the same however much history is kept. Of the scheduled jobs, those parked for
-- a signal and those asleep (their last recorded step a sleep): a probe by primary key of
-- each scheduled job's wait and last step, never a scan of the steps.
SELECT j.queue, j.status, count(*) AS jobs,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now())
                          - min(j.run_at) FILTER (WHERE j.status = 'queued'))::float8
           AS oldest_queued_seconds,
       count(*) FILTER (
           WHERE j.status = 'scheduled'
             AND EXISTS (SELECT 1 FROM {schema}.signal_waits AS w WHERE w.job_id = j.id)
       ) AS waiting_for_signal,
       count(*) FILTER (
           WHERE j.status = 'scheduled'
             AND (SELECT l.kind FROM {schema}.job_steps AS l WHERE l.job_id = j.id
                  ORDER BY l.seq DESC LIMIT 1) = 'sleep'
       ) AS sleeping
FROM {schema}.jobs AS j
GROUP BY j.queue, j.status
ORDER BY j.queue, j.status;

-- name: transaction_without_jit
-- Turns JIT compilation off until the transaction ends. queue_read_activity's estimate is
-- the cost of its history lookups times the queues it might find, which the planner puts in
-- the thousands on tables it has no statistics for (workers, queue_pauses): past
-- jit_above_cost, so each read first compiled its expressions, which took far longer than
-- the read, and its generic plan, past jit_optimize_above_cost, optimised them too, longer
-- still. Local to the transaction, so nothing stays on a connection PgBouncer hands to
-- another client.
SELECT set_config('jit', 'off', true);

-- name: queue_read_activity
-- Per queue, what the dashboard's queues page shows: live jobs by status and the oldest
-- queued job's wait, from the hot table; and from history only what its (queue, status,
-- finished_at) index finds in a range: successes in the last minute and failures in the last
-- hour. Never a count of the whole last hour's successes (queue_list_stats), whose cost grows
-- with throughput. The queues are those with live jobs, those a worker serves, and those
-- paused.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'waiting') AS waiting,
           count(*) FILTER (WHERE status = 'blocked') AS blocked,
           min(run_at) FILTER (WHERE status = 'queued') AS oldest_queued_run_at
    FROM {schema}.jobs
    GROUP BY queue
), names AS (
    SELECT queue FROM live
    UNION
    SELECT unnest(queues) FROM {schema}.workers
    UNION
    SELECT queue FROM {schema}.queue_pauses
)
SELECT n.queue,
       coalesce(l.queued, 0) AS queued,
       coalesce(l.scheduled, 0) AS scheduled,
       coalesce(l.running, 0) AS running,
       coalesce(l.waiting, 0) AS waiting,
       coalesce(l.blocked, 0) AS blocked,
       (SELECT count(*) FROM {schema}.job_history AS h
        WHERE h.queue = n.queue AND h.status = 'succeeded'
          AND h.finished_at > c.now - interval '1 minute' AND h.finished_at <= c.now)
           AS succeeded_last_minute,
       (SELECT count(*) FROM {schema}.job_history AS h
        WHERE h.queue = n.queue AND h.status = 'failed'
          AND h.finished_at > c.now - interval '1 hour' AND h.finished_at <= c.now)
           AS failed_last_hour,
       c.now - l.oldest_queued_run_at AS oldest_queued_age,
       EXISTS (SELECT FROM {schema}.queue_pauses AS p WHERE p.queue = n.queue) AS paused
FROM names AS n
LEFT JOIN live AS l USING (queue)
CROSS JOIN clock AS c
ORDER BY n.queue;
