-- raw bound with a wake-up: one job row and one pg_notify per transaction. Shows what the
-- notification costs: PostgreSQL serialises the commits of notifying transactions.
INSERT INTO jobs (queue, task, args) VALUES ('default', 'noop', '{"seq": 1}') RETURNING id, pg_notify('pgqueue_bench_jobs', 'default');
