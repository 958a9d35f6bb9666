-- Least-privilege roles. {role} is rendered as an identifier like {schema}.

-- name: grant_worker
-- What a worker needs on the schema and nothing else: read and move jobs, write history,
-- keep its own row. Advisory locks and LISTEN/NOTIFY need no grant. No DDL, no other schema.
-- Finding a dead worker by its ended session reads pg_stat_activity, which shows a session's
-- backend_start to its own role only: workers of other roles need pg_read_all_stats for it
-- (granted apart, as it reaches beyond the schema), or they leave each other to the lease.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.jobs, {schema}.job_history, {schema}.workers
    TO {role};
-- Removing a worker row records it (migration 0042); the rescuer reads and prunes those.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.workers_removed TO {role};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
GRANT SELECT ON {schema}.migrations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.periodic, {schema}.periodic_ticks TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.concurrency_slots TO {role};
GRANT SELECT ON {schema}.concurrency_limits TO {role};
GRANT SELECT ON {schema}.queue_pauses TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.job_deps, {schema}.job_waits TO {role};
GRANT SELECT, UPDATE ON {schema}.rate_limits TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.job_rate_limits TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.wake_listeners TO {role};
-- Fair shares: the fair claim moves the queue's clock and logs starts (its follow-up
-- enqueues stamp their keys' clocks); the sweep folds the log into counts and drops old ones.
GRANT SELECT, INSERT, UPDATE ON {schema}.fairness_keys, {schema}.fairness_clocks TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.fairness_starts TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.fairness_start_log TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.fairness_clock_log, {schema}.fairness_key_log TO {role};
GRANT SELECT ON {schema}.fairness_weights TO {role};
-- Finishing a job reads who waits for it; a handler may wait for other jobs itself.
GRANT SELECT, INSERT, DELETE ON {schema}.result_waiters TO {role};
-- The relay publishes staged messages and deletes them once confirmed.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.outbox, {schema}.relays TO {role};
-- Durable steps: recorded and read back; signals taken, jobs parked for them.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.job_steps, {schema}.signals,
    {schema}.signal_waits TO {role};
-- The history's daily partitions: made ahead and dropped by retention, through two functions
-- that run as their owner, so the worker needs no DDL right of its own.
GRANT EXECUTE ON FUNCTION {schema}.history_partitions_step(integer, integer),
    {schema}.history_partitions_drop(timestamptz, integer) TO {role};
-- A worker writes its tasks' declarations as it starts, for enqueue() in SQL to read.
GRANT SELECT, INSERT, UPDATE ON {schema}.tasks TO {role};

-- name: grant_app
-- What an application that only enqueues and reads its jobs back needs.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT INSERT, SELECT ON {schema}.jobs TO {role};
GRANT SELECT ON {schema}.job_history TO {role};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
-- Workflows: their edges and counts, and the mark (and lock) on earlier jobs they wait for.
GRANT INSERT, SELECT ON {schema}.job_deps, {schema}.job_waits TO {role};
GRANT UPDATE (workflow_id) ON {schema}.jobs TO {role};
-- wake() reads which wake-ups the workers want (sql/migrations/0015_quiet_wake.sql).
GRANT SELECT ON {schema}.wake_listeners TO {role};
-- Waiting for a job's result (Queue.wait) registers the wait, and ends it.
GRANT SELECT, INSERT, DELETE ON {schema}.result_waiters TO {role};
-- Messages for other systems, staged in the application's transactions.
GRANT SELECT, INSERT ON {schema}.outbox TO {role};
-- Signals to waiting jobs, through a function that runs as its owner: it stores the signal
-- and wakes the job waiting for it, which this role may not move itself. signal() is its
-- checked form for SQL callers.
GRANT EXECUTE ON FUNCTION {schema}.signal_send(text, jsonb), {schema}.signal(text, jsonb)
    TO {role};
-- Jobs with a fairness key take their place from their key's clock and their queue's.
GRANT SELECT, INSERT, UPDATE ON {schema}.fairness_keys TO {role};
GRANT SELECT, INSERT ON {schema}.fairness_clocks TO {role};
GRANT SELECT ON {schema}.fairness_clock_log TO {role};
GRANT SELECT, INSERT ON {schema}.fairness_key_log TO {role};
GRANT SELECT ON {schema}.fairness_weights TO {role};
-- enqueue() in SQL reads the options its task declared (sql/migrations/0039_task_options.sql).
GRANT SELECT ON {schema}.tasks TO {role};

-- name: grant_read
-- What the dashboard and a metrics scrape need to show everything and change nothing. The
-- horizon's holders show their query text only to a role with pg_read_all_stats (or to the
-- holder's own role): grant it separately if the dashboard should name them.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};

-- name: grant_operator
-- What the dashboard's actions need besides reading: retry and cancel jobs (as a worker moves
-- them), pause and resume queues, and set tenants' limits. Nothing a worker does on its own
-- needs the last two, so the worker role does not have them.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT INSERT, UPDATE, DELETE ON {schema}.jobs, {schema}.job_history TO {role};
GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role};
GRANT INSERT, UPDATE, DELETE ON {schema}.queue_pauses, {schema}.concurrency_limits,
    {schema}.concurrency_slots, {schema}.job_deps, {schema}.job_waits,
    {schema}.fairness_weights TO {role};
