-- The tasks' declarations (migration 0039), where enqueue() in SQL reads a task's options.

-- name: task_sync
-- Writes the declarations given (a JSON array, one object per task) to tasks; returns the
-- names whose row is new or changed. Rows go in name order, so two workers starting at once
-- lock them in the same order and never wait on each other in a cycle; an unchanged row is
-- not rewritten, so a fleet starting together writes each declaration once. A task not given
-- keeps its row: another application may declare it, on the same schema.
INSERT INTO {schema}.tasks AS t
    (name, queue, priority, max_attempts, delay, dedupe_window, atomic, concurrency_key,
     limit_keys, fairness_key, tags, retry_base, retry_cap, retry_jitter, timeout, on_lost,
     compensate_with)
SELECT i.name, i.queue, i.priority, i.max_attempts, make_interval(secs => i.delay),
       make_interval(secs => i.dedupe_window), i.atomic, i.concurrency_key, i.limit_keys,
       i.fairness_key, i.tags, make_interval(secs => i.retry_base),
       make_interval(secs => i.retry_cap), i.retry_jitter, make_interval(secs => i.timeout),
       i.on_lost, i.compensate_with
FROM jsonb_to_recordset(%(tasks)s::jsonb)
     AS i(name text, queue text, priority smallint, max_attempts integer,
          delay double precision, dedupe_window double precision, atomic boolean,
          concurrency_key text, limit_keys text[], fairness_key text, tags text[],
          retry_base double precision, retry_cap double precision,
          retry_jitter double precision, timeout double precision, on_lost text,
          compensate_with text)
ORDER BY i.name
ON CONFLICT (name) DO UPDATE
SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
    delay = excluded.delay, dedupe_window = excluded.dedupe_window, atomic = excluded.atomic,
    concurrency_key = excluded.concurrency_key, limit_keys = excluded.limit_keys,
    fairness_key = excluded.fairness_key, tags = excluded.tags,
    retry_base = excluded.retry_base, retry_cap = excluded.retry_cap,
    retry_jitter = excluded.retry_jitter, timeout = excluded.timeout,
    on_lost = excluded.on_lost, compensate_with = excluded.compensate_with, updated_at = now()
WHERE (t.queue, t.priority, t.max_attempts, t.delay, t.dedupe_window, t.atomic,
       t.concurrency_key, t.limit_keys, t.fairness_key, t.tags, t.retry_base, t.retry_cap,
       t.retry_jitter, t.timeout, t.on_lost, t.compensate_with)
      IS DISTINCT FROM
      (excluded.queue, excluded.priority, excluded.max_attempts, excluded.delay,
       excluded.dedupe_window, excluded.atomic, excluded.concurrency_key, excluded.limit_keys,
       excluded.fairness_key, excluded.tags, excluded.retry_base, excluded.retry_cap,
       excluded.retry_jitter, excluded.timeout, excluded.on_lost, excluded.compensate_with)
RETURNING t.name;
