-- The workers table (registration, heartbeat, listing, cleanup), the rescuer's lock, and the
-- session settings of a worker's own connections.

-- name: worker_register
-- Records a starting worker; its id guards every write it makes to a job. With `client_pid`,
-- also the session it registers on, as worker_heartbeat records one, so that rescuers can
-- find the worker dead from its first moment; its heartbeat's first beat records its own.
INSERT INTO {schema}.workers (name, hostname, pid, queues, concurrency, session_pid,
                              session_start, session_server_start)
SELECT %(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s, b.pid, b.backend_start,
       b.server_start
FROM (VALUES (%(client_pid)s::integer)) AS client (pid)
LEFT JOIN (
    SELECT a.pid, a.backend_start, pg_postmaster_start_time() AS server_start
    FROM pg_stat_get_activity(pg_backend_pid()) AS a
) AS b ON b.pid = client.pid
RETURNING id;

-- name: worker_heartbeat
-- Proves the worker alive: one row per worker, never one per job. If the rescuer removed the
-- row (the worker was presumed dead), it is put back under the same id and `revived` is true:
-- the jobs it held were rescued, and their late outcomes are refused by the completion guard.
-- `stats` is the worker's own tally (pgqueue/observe.py), replaced at each beat.
-- Each beat also records the server session it runs on, its pid and backend start, which
-- rescuers look for (worker_sessions_gone): a worker that reconnects after its session was
-- ended replaces the old one with its first beat on the new. `client_pid` is the pid the
-- server named when the connection opened (NULL: record none); the session is recorded only
-- when it is the backend running this beat, so never behind a pooler such as PgBouncer,
-- which names a pid of its own and whose server sessions outlive the worker and serve other
-- clients. `recorded` says whether it was. session_at is written NULL: older versions'
-- rescuers try a lock for it that this version does not hold.
INSERT INTO {schema}.workers AS w (id, name, hostname, pid, queues, concurrency, stats,
                                   session_pid, session_start, session_server_start)
OVERRIDING SYSTEM VALUE
SELECT %(worker_id)s, %(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s,
       %(stats)s::jsonb, b.pid, b.backend_start, b.server_start
FROM (VALUES (%(client_pid)s::integer)) AS client (pid)
LEFT JOIN (
    SELECT a.pid, a.backend_start, pg_postmaster_start_time() AS server_start
    FROM pg_stat_get_activity(pg_backend_pid()) AS a
) AS b ON b.pid = client.pid
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), stats = EXCLUDED.stats, session_at = NULL,
    session_pid = EXCLUDED.session_pid, session_start = EXCLUDED.session_start,
    session_server_start = EXCLUDED.session_server_start
RETURNING (xmax = 0) AS revived, w.session_pid IS NOT NULL AS recorded;

-- name: worker_sessions_gone
-- The workers whose recorded session (worker_heartbeat) the server no longer has, with that
-- session and when this was seen. A session is its pid and its backend start together, since
-- pids are reused. Left out: the caller's own worker and workers with no session recorded;
-- sessions recorded on another server (before a failover) or that began before this
-- server's last start or crash restart (the archiver's statistics are reset at a crash
-- restart), which ended with every other, so that a live worker's lag in reconnecting then
-- is never taken for its death and only the lease speaks for workers that died meanwhile;
-- and a pid whose
-- backend_start this role may not read (another role's session, without pg_read_all_stats),
-- which may be the recorded session or a reuse of its pid, so the worker is taken as alive.
SELECT w.id AS worker_id, w.session_pid, w.session_start, now() AS seen_at
FROM {schema}.workers AS w
WHERE w.session_pid IS NOT NULL
  AND w.id <> %(worker_id)s
  AND w.session_server_start = pg_postmaster_start_time()
  AND w.session_start > (
      SELECT greatest(pg_postmaster_start_time(), a.stats_reset) FROM pg_stat_archiver AS a
  )
  AND NOT EXISTS (
      SELECT 1 FROM pg_stat_get_activity(w.session_pid) AS s
      WHERE s.backend_start = w.session_start OR s.backend_start IS NULL
  )
ORDER BY w.id;

-- name: worker_delete_gone
-- Removes the workers whose recorded session is still the one the caller saw gone
-- (worker_sessions_gone): their running jobs are the caller's to rescue in this transaction.
-- An ended session never comes back, so the only race is with the worker's own beat from a
-- new session, and the row lock settles it: a beat that committed first recorded its new
-- session and the worker is left alone; one that comes after finds its row gone, puts it
-- back and is told that its jobs were rescued.
DELETE FROM {schema}.workers AS w
USING unnest(%(ids)s::bigint[], %(pids)s::integer[], %(starts)s::timestamptz[])
      AS g (id, pid, start)
WHERE w.id = g.id
  AND w.session_pid = g.pid
  AND w.session_start = g.start
RETURNING w.id;

-- name: worker_list
-- The workers with a row, newest first, each with its running jobs (a lookup per worker in
-- jobs_running_idx) and the age of its last heartbeat by the database's clock. A worker
-- whose heartbeat is older than its lease is dead and about to be rescued.
SELECT w.id, w.name, w.hostname, w.pid, w.queues, w.concurrency, w.started_at, w.heartbeat_at,
       coalesce(%(now)s::timestamptz, now()) - w.heartbeat_at AS silent_for,
       (SELECT count(*) FROM {schema}.jobs AS j
        WHERE j.worker_id = w.id AND j.status = 'running') AS running,
       w.stats
FROM {schema}.workers AS w
ORDER BY w.id DESC
LIMIT %(limit)s;

-- name: worker_deregister
-- Removes a worker that stopped cleanly, after its jobs were finished or put back.
DELETE FROM {schema}.workers WHERE id = %(worker_id)s;

-- name: session_set_async_commit
-- Makes this session's commits return before their WAL is flushed. Run on the lease-claim
-- connection only (pgqueue/worker/sessions.py): a claim lost in a server crash leaves
-- its job queued, or running for a worker the rescuer then finds dead, which a crash causes
-- anyway; and the outcome's commit, synchronous, flushes the claim's WAL with its own. Never
-- on an atomic lane, whose commit carries the handler's writes.
SELECT set_config('synchronous_commit', 'off', false);

-- name: session_prefer_indexes
-- Keeps the planner off sequential scans and JIT in the worker's own sessions (claim and
-- completer), whose statements are all written for index access (test_claim_plan.py,
-- test_finish_plan.py) and return quickly. A prepared statement keeps the generic plan
-- it got when the table was small, and without fresh statistics (autovacuum off, or the first
-- minute of a new table) nothing replans it: the outcome writes kept a sequential scan of
-- jobs planned while it was nearly empty, and once a held horizon had bloated the heap each
-- write read all of it. Tables with no usable index (the small concurrency tables) are
-- still scanned: the setting only makes that path the last resort. JIT compiles a statement
-- whose estimate passes jit_above_cost, which stale estimates on a bloated table can do, and
-- the compiling alone costs far more than a claim. Never set on an atomic lane:
-- that session runs the handler's own statements.
SELECT set_config('enable_seqscan', 'off', false), set_config('jit', 'off', false);

-- name: session_generic_plans
-- Runs the claim connection's prepared statements on their generic plans. A claim's LIMIT is a
-- parameter (the free slots), and a generic plan is costed as if it read a tenth of the range,
-- so PostgreSQL judged it dearer than a plan made for the values and planned every claim
-- afresh: with every index of jobs weighed twice (the scan and the update), planning a claim
-- could cost the server as much as running it. The plans are the same either way: every
-- statement of this connection is written for the generic plan too, and the plan tests check
-- both (test_claim_plan.py, test_claim_session_plans.py). Not on the completer's connection,
-- whose statements already settle on their generic plans, nor when polling only.
SELECT set_config('plan_cache_mode', 'force_generic_plan', false);

-- name: worker_listen
-- Subscribes to the schema's wake-up channel (pgqueue/wakeup.py reads its payloads).
LISTEN {channel};

-- name: worker_rescue_lock
-- Lets one rescuer act at a time across all workers of the schema; released at commit.
SELECT pg_try_advisory_xact_lock(hashtext('pgqueue.rescue'), hashtext(%(schema)s));

-- name: worker_delete_dead
-- Removes workers silent for longer than the lease once none of their jobs is still running.
-- A row locked by a beat (its worker stopped in the middle of one, a paused process or VM) is
-- left for a later pass: waiting for it would keep the rescuing transaction, and the rescue
-- lock it holds, open until that worker wakes.
DELETE FROM {schema}.workers AS w
WHERE w.id IN (
    SELECT d.id FROM {schema}.workers AS d
    WHERE d.heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease)s)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.jobs AS j WHERE j.worker_id = d.id AND j.status = 'running'
      )
    FOR UPDATE SKIP LOCKED
);

-- name: worker_removed_prune
-- Forgets the removed workers that came back (a beat put the row back), and those removed
-- longer ago than the lease that have no running job left: a claim of theirs in flight at
-- the removal has committed by then, and any job it took was rescued first.
DELETE FROM {schema}.workers_removed AS r
WHERE EXISTS (SELECT 1 FROM {schema}.workers AS w WHERE w.id = r.id)
   OR (r.removed_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(lease)s)
       AND NOT EXISTS (
           SELECT 1 FROM {schema}.jobs AS j WHERE j.worker_id = r.id AND j.status = 'running'
       ));

-- name: transaction_bound_idle
-- Server-side backstop for an atomic job's transaction: if its worker hangs while idle in the
-- transaction past this many milliseconds, PostgreSQL ends the session and the job is freed.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true);

-- name: worker_notify_dead_job
-- Tells listeners on the schema's dead-job channel that a job was abandoned; sent at commit.
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: worker_wake_range
-- Says which wake-ups this worker does not need, per queue: those for jobs with a priority
-- from `below` to `above` (sql/migrations/0015_quiet_wake.sql), only those of new jobs when
-- `new_only` (0035_steady_wake.sql). Rows already right are left alone, so a worker that
-- repeats itself writes nothing.
INSERT INTO {schema}.wake_listeners AS l (worker_id, queue, below, above, new_only)
SELECT %(worker_id)s, q.queue, q.below, q.above, q.new_only
FROM unnest(%(queues)s::text[], %(below)s::integer[], %(above)s::integer[],
            %(new_only)s::boolean[]) AS q (queue, below, above, new_only)
ON CONFLICT (worker_id, queue) DO UPDATE
SET below = excluded.below, above = excluded.above, new_only = excluded.new_only
WHERE (l.below, l.above, l.new_only)
      IS DISTINCT FROM (excluded.below, excluded.above, excluded.new_only);

-- name: worker_transactions_in_progress
-- The transactions in progress now (a fresh snapshot's), as numbers.
SELECT coalesce(array_agg(x::text::bigint), '{{}}')
FROM pg_snapshot_xip(pg_current_snapshot()) AS x;

-- name: worker_transactions_still_in_progress
-- Which of these transactions have not ended yet (a transaction too old for the commit log
-- to know has ended long ago).
SELECT coalesce(array_agg(x), '{{}}')
FROM unnest(%(xids)s::bigint[]) AS x
WHERE pg_xact_status(x::text::xid8) = 'in progress';
