-- 0022: what each worker says of its own work, written by its heartbeat: outcomes counted since
-- it started and its recent claim time. The dashboard reads them to draw throughput and claim
-- latency without reading history; a worker that predates this column leaves it NULL.
ALTER TABLE {schema}.workers ADD COLUMN stats jsonb;
