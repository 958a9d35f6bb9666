-- Bookkeeping for the migrator. The advisory lock serialises concurrent migrators.

-- name: migration_lock
-- Held until the migrating transaction ends; a second migrator waits, then finds nothing to do.
SELECT pg_advisory_xact_lock(hashtext('pgqueue.migrate'), hashtext(%(schema)s));

-- name: migration_table_create
-- Creates the schema and the list of applied migrations if this is the first run.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
-- Versions already applied.
SELECT version FROM {schema}.migrations ORDER BY version;

-- name: migration_record
-- Marks one migration applied, in the transaction that applied it.
INSERT INTO {schema}.migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_table_exists
-- Whether the schema has been migrated at least once.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_tables
    WHERE schemaname = %(schema)s AND tablename = 'migrations'
);

-- name: schema_drop
-- Drops a schema and everything in it: a test's throwaway schema (pgqueue/pytest_plugin.py).
-- IF EXISTS: dropping one a test already dropped is not an error.
DROP SCHEMA IF EXISTS {schema} CASCADE;
