-- raw bound: :rows job rows in one multi-row INSERT per transaction (rows made by the server).
INSERT INTO jobs (queue, task, args)
SELECT 'default', 'noop', jsonb_build_object('seq', n) FROM generate_series(1, :rows) AS n;
