-- 0041: a dead worker is found by any worker, one that has just started included, within
-- seconds of its death.
--
-- Each beat records the server backend of the worker's heartbeat connection: its pid and its
-- pg_stat_activity.backend_start, which together name one session for the server's life (a
-- pid alone is reused). When the process dies, PostgreSQL ends its sessions; a rescuer that
-- finds the recorded session missing from pg_stat_activity for a couple of seconds takes the
-- worker for dead (worker_sessions_gone, sql/queries/workers.sql). A live worker whose session
-- ends opens a new one and records it at once. session_server_start is the start of the
-- server the session lived on (pg_postmaster_start_time()): after a failover to another
-- server, no recorded session is on this one, and none may be taken for a death. NULL: the worker has no session of its own
-- (PgBouncer's pooling) or predates this column, and only its lease speaks for it.
--
-- session_at (0026) is no longer written by this version: it is NULL in the rows of workers
-- of this version, so older workers' rescuers, which try a lock that these workers no longer
-- hold, leave them to their lease.
ALTER TABLE {schema}.workers ADD COLUMN session_pid integer,
                             ADD COLUMN session_start timestamptz,
                             ADD COLUMN session_server_start timestamptz;
