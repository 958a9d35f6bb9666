-- The workers table (registration, heartbeat, listing, cleanup), the rescuer's lock, and the
-- session settings of a worker's own connections.

-- name: worker_register
-- Records a starting worker; its id guards every write it makes to a job.
INSERT INTO {schema}.workers (name, hostname, pid, queues, concurrency)
VALUES (%(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
RETURNING id;

-- name: worker_heartbeat
-- Proves the worker alive: one row per worker, never one per job. If the rescuer removed the
-- row (the worker was presumed dead), it is put back under the same id and `revived` is true:
-- the jobs it held were rescued, and their late outcomes are refused by the completion guard.
-- `stats` is the worker's own tally (pgqueue/observe.py), replaced at each beat. `session_at`
-- says when this connection took the worker's session lock (worker_session_hold), NULL if it
-- holds none: a beat comes from the session that holds the lock, so a beat later than a
-- rescuer's own session start proves the lock was held since (worker_sessions_gone).
INSERT INTO {schema}.workers AS w (id, name, hostname, pid, queues, concurrency, stats,
                                   session_at)
OVERRIDING SYSTEM VALUE
VALUES (%(worker_id)s, %(name)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s,
        %(stats)s::jsonb, %(session_at)s)
ON CONFLICT (id) DO UPDATE
SET heartbeat_at = now(), stats = EXCLUDED.stats, session_at = EXCLUDED.session_at
RETURNING (xmax = 0) AS revived;

-- name: worker_session_hold
-- Takes the worker's session lock on this connection, until it closes, and says when: the
-- caller records that time with a beat in the same transaction (worker_heartbeat). The lock
-- lives in pgqueue's own space, one per schema and worker id: the key folds the id, so two
-- ids 2^31 - 1 apart share a lock, which can only make a dead worker look alive (the lease
-- then speaks for it), never the reverse; another application's lock on the same key does
-- the same. Shared, so a new session of the worker takes it while an old one lingers; it
-- waits only while a rescuer holds it for the transaction that declares the worker dead
-- (worker_delete_gone), after which the beat finds its row gone. Never behind PgBouncer's
-- transaction pooling: the lock would stay on a server connection that other clients use.
SELECT pg_advisory_lock_shared(
           hashtext('pgqueue.worker ' || %(schema)s),
           (%(worker_id)s::bigint %% 2147483647)::integer
       ),
       now() AS session_at;

-- name: worker_sessions_gone
-- The workers whose session lock (worker_session_hold) nobody holds now, with the session
-- each recorded and when this was seen. A try of each lock, not a read of pg_locks: any
-- role may, it costs a lookup per worker and no pass over the server's lock table, and it
-- holds a free lock only for this statement. Left out: workers that hold no such lock, the
-- caller's own worker, and workers whose last beat is not later than the start of this
-- statement's own backend. A beat comes from the session that holds the lock, so a later
-- beat proves the lock was held while this backend lived: its loss was no server restart,
-- which would have ended this backend too. The others' locks may have gone with a restart,
-- and only their lease speaks for them.
SELECT w.id AS worker_id, w.session_at, now() AS seen_at
FROM {schema}.workers AS w
WHERE w.session_at IS NOT NULL
  AND w.id <> %(worker_id)s
  AND w.heartbeat_at > (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a)
  AND pg_try_advisory_xact_lock(
          hashtext('pgqueue.worker ' || %(schema)s), (w.id %% 2147483647)::integer
      )
ORDER BY w.id;

-- name: worker_delete_gone
-- Removes the workers whose session lock is still free with the same session recorded as
-- when the caller saw them gone (worker_sessions_gone): their running jobs are the caller's
-- to rescue in this transaction. The free lock is the caller's until commit, so a worker
-- that is in fact reconnecting cannot take it back meanwhile; its beat then finds its row
-- gone, puts it back and is told that its jobs were rescued. A worker that took the lock
-- back before this statement has a new session recorded and is left alone.
DELETE FROM {schema}.workers AS w
USING unnest(%(ids)s::bigint[], %(sessions)s::timestamptz[]) AS g (id, session_at)
WHERE w.id = g.id
  AND w.session_at = g.session_at
  AND w.heartbeat_at > (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) AS a)
  AND pg_try_advisory_xact_lock(
          hashtext('pgqueue.worker ' || %(schema)s), (w.id %% 2147483647)::integer
      )
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
