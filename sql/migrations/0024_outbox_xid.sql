-- 0024: the transaction that staged each outbox message, so that the relay can read, behind
-- the point it has read up to, the messages of exactly those transactions that were still
-- open when it passed them (outbox_read says why that keeps each key's order).
-- Rows staged before this migration have none: ALTER TABLE waited for every staging
-- transaction to end, so all of them are committed. The default is set apart from ADD COLUMN
-- so that those rows are not rewritten with this migration's own transaction id.
ALTER TABLE {schema}.outbox ADD COLUMN xid xid8;
ALTER TABLE {schema}.outbox ALTER COLUMN xid SET DEFAULT pg_current_xact_id();

-- The relay looks up the messages of the transactions it saw open, each by its id.
CREATE INDEX outbox_staged_xid_idx ON {schema}.outbox (xid) WHERE status = 'staged';
