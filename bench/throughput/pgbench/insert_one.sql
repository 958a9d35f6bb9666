-- raw bound: one job row per transaction (autocommit), nothing else: no wake-up, no RETURNING.
INSERT INTO jobs (queue, task, args) VALUES ('default', 'noop', '{"seq": 1}');
